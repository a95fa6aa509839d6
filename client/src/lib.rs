//! stampfs-client (being built).
