//! stampfs-chunkserver (being built).
