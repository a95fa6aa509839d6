//! stampfs-master (being built).
