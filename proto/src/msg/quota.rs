//! Directory quotas, as HDFS's: a limit on the names (files, directories and links,
//! the directory itself included) and one on the bytes (each file's length times its
//! replication factor; a file being written counts each of its chunks whole) below a
//! directory. Set by superusers (`stampfs admin quota`), read by anyone who may look
//! up the directory (`stampfs count -q`).

use super::Caller;
use crate::units::format_size;
use bincode::{Decode, Encode};
use serde::Serialize;

/// How a quota request changes one of a directory's two limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum QuotaChange {
    /// Leaves it as it is.
    Keep,
    /// Removes it: no limit.
    Clear,
    /// Sets it to this (a limit below what is in use already is allowed: nothing is
    /// removed, but nothing more fits until enough is).
    Set(u64),
}

/// Sets or clears the quotas of the directory at `path` (superusers only). Answers
/// the directory's quotas after the change.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct SetQuota {
    pub path: String,
    pub names: QuotaChange,
    pub bytes: QuotaChange,
}

/// The quotas of the directory at `path` and what its subtree uses of them.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct GetQuota {
    pub path: String,
    /// Who asks (it must be able to look the directory up; root without one).
    pub caller: Option<Caller>,
}

/// Every directory that has a quota (superusers only).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ListQuotas {}

/// One limit and what its subtree counts against it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct QuotaUse {
    pub limit: u64,
    pub used: u64,
}

impl QuotaUse {
    /// What is left (zero once the use reached or passed the limit).
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }
}

/// A directory's quotas: `None` where it has no limit.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
pub struct QuotaReport {
    pub path: String,
    pub names: Option<QuotaUse>,
    pub bytes: Option<QuotaUse>,
}

/// Which limit a request would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaResource {
    Names,
    Bytes,
}

/// The message of a refusal: `/d` allows `limit`, uses `used`, and the request
/// needed `requested` more.
pub fn describe_quota_exceeded(
    path: &str,
    resource: QuotaResource,
    limit: u64,
    used: u64,
    requested: u64,
) -> String {
    match resource {
        QuotaResource::Names => format!(
            "the name quota of {path} is exceeded: {limit} allowed, {used} in use, {requested} more asked"
        ),
        QuotaResource::Bytes => format!(
            "the space quota of {path} is exceeded: {} allowed, {} in use, {} more asked \
             (bytes count once per replica; a chunk being written counts whole)",
            format_size(limit),
            format_size(used),
            format_size(requested)
        ),
    }
}
