//! [`OpenOptions`]: how a writer is opened, in the style of `std::fs::OpenOptions`.
//!
//! | options                      | file exists                         | file missing |
//! |------------------------------|-------------------------------------|--------------|
//! | `append`                     | append writer at the end            | `NotFound`   |
//! | `append` + `create`          | append writer at the end            | created      |
//! | `write`                      | writer for writes anywhere, at 0    | `NotFound`   |
//! | `write` + `create`           | writer for writes anywhere, at 0    | created      |
//! | `write` + `truncate`         | replaced by an empty file           | `NotFound`   |
//! | `write` + `create_new`       | `AlreadyExists`                     | created      |
//!
//! A writer for writes anywhere ([`WriteMode::Anywhere`]) seeks and writes anywhere in
//! the file and past its end (see [`FileWriter`]), and reads what it wrote with
//! [`FileWriter::read_at`] (`read` with `write` asks for nothing more; other readers
//! use [`Client::open`] and see what the writer hflushed). An append writer does not
//! read: `read` with `append` is refused with `NotSupported`; `truncate` with
//! `append`, or neither `write` nor `append`, with `InvalidArgument`, as `std` does.

use crate::client::{Client, CreateOptions};
use crate::error::{Error, Result};
use crate::writer::{FileWriter, WriteMode};
use stampfs_proto::RemoteError;

/// Builds a [`FileWriter`] (see the module docs).
#[derive(Clone, Debug)]
pub struct OpenOptions {
    client: Client,
    read: bool,
    write: bool,
    append: bool,
    create: bool,
    create_new: bool,
    truncate: bool,
    replication: Option<u8>,
    chunk_size: Option<u64>,
}

impl OpenOptions {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            read: false,
            write: false,
            append: false,
            create: false,
            create_new: false,
            truncate: false,
            replication: None,
            chunk_size: None,
        }
    }

    /// Read as well as write: not supported (see the module docs).
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }

    /// Write anywhere in the file.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }

    /// Write at the end only (implies `write`).
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }

    /// Create the file when it does not exist.
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }

    /// Create the file, failing with `AlreadyExists` when it exists.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }

    /// Replace an existing file by an empty one.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }

    /// Replicas per chunk of a file this creates (the master's default otherwise).
    pub fn replication(&mut self, n: u8) -> &mut Self {
        self.replication = Some(n);
        self
    }

    /// Chunk size of a file this creates (the master's default otherwise).
    pub fn chunk_size(&mut self, bytes: u64) -> &mut Self {
        self.chunk_size = Some(bytes);
        self
    }

    /// What these options ask for, or why they are refused.
    fn plan(&self, path: &str) -> Result<Plan> {
        if !self.write && !self.append {
            return Err(Error::InvalidArgument {
                reason: format!("opening {path}: a writer needs write or append"),
            });
        }
        if self.read && self.append {
            return Err(Error::NotSupported {
                path: path.into(),
                reason: "an append writer that also reads: open it with write (a writer for \
                         writes anywhere reads with read_at), or read with Client::open"
                    .into(),
            });
        }
        if self.append && self.truncate {
            return Err(Error::InvalidArgument {
                reason: format!("opening {path}: truncate and append together"),
            });
        }
        let mode = if self.append {
            WriteMode::Append
        } else {
            WriteMode::Anywhere
        };
        Ok(if self.create_new {
            Plan::Create {
                replace: false,
                mode,
            }
        } else if self.truncate {
            Plan::Replace {
                create: self.create,
            }
        } else {
            Plan::Reopen {
                create: self.create,
                mode,
            }
        })
    }

    /// Opens `path` for writing as the options say.
    pub async fn open(&self, path: &str) -> Result<FileWriter> {
        let c = &self.client;
        let opts = |overwrite, attr| CreateOptions {
            replication: self.replication,
            chunk_size: self.chunk_size,
            overwrite,
            attr,
        };
        match self.plan(path)? {
            Plan::Create { replace, mode } => c.create_with(path, opts(replace, None), mode).await,
            Plan::Replace { create } => {
                // A truncated file keeps its mode and owner, as on a local filesystem.
                let kept = match c.stat(path).await {
                    Ok(st) => Some(stampfs_proto::NewAttr {
                        mode: st.attr.mode,
                        uid: st.attr.uid,
                        gid: st.attr.gid,
                    }),
                    Err(Error::Remote(RemoteError::NotFound { .. })) if create => None,
                    Err(e) => return Err(e),
                };
                c.create_with(path, opts(true, kept), WriteMode::Anywhere)
                    .await
            }
            Plan::Reopen { create, mode } => match c.reopen(path, mode).await {
                Err(Error::Remote(RemoteError::NotFound { .. })) if create => {
                    match c.create_with(path, opts(false, None), mode).await {
                        // Created by someone else meanwhile: open theirs.
                        Err(Error::Remote(RemoteError::AlreadyExists { .. })) => {
                            c.reopen(path, mode).await
                        }
                        other => other,
                    }
                }
                other => other,
            },
        }
    }
}

/// What an [`OpenOptions`] comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Create { replace: bool, mode: WriteMode },
    Replace { create: bool },
    Reopen { create: bool, mode: WriteMode },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> OpenOptions {
        OpenOptions::new(Client::unconnected_for_tests())
    }

    #[test]
    fn the_options_map_to_plans_as_std_does() {
        assert!(matches!(
            opts().plan("/f"),
            Err(Error::InvalidArgument { .. })
        ));
        assert_eq!(
            opts().write(true).plan("/f").expect("plan"),
            Plan::Reopen {
                create: false,
                mode: WriteMode::Anywhere
            }
        );
        assert_eq!(
            opts().append(true).create(true).plan("/f").expect("plan"),
            Plan::Reopen {
                create: true,
                mode: WriteMode::Append
            }
        );
        assert_eq!(
            opts().write(true).truncate(true).plan("/f").expect("plan"),
            Plan::Replace { create: false }
        );
        assert_eq!(
            opts()
                .write(true)
                .create(true)
                .create_new(true)
                .truncate(true)
                .plan("/f")
                .expect("plan"),
            Plan::Create {
                replace: false,
                mode: WriteMode::Anywhere
            }
        );
        assert!(matches!(
            opts().append(true).truncate(true).plan("/f"),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            opts().read(true).append(true).plan("/f"),
            Err(Error::NotSupported { .. })
        ));
        assert!(matches!(
            opts().read(true).write(true).plan("/f"),
            Ok(Plan::Reopen {
                create: false,
                mode: WriteMode::Anywhere
            })
        ));
    }
}
