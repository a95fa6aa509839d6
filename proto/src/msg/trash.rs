//! The trash's own requests (`stampfs rm --skip-trash`, `stampfs trash restore`);
//! `Delete` moves entries into the trash (`/.trash/<user>/Current/<original path>`).

use super::Caller;
use bincode::{Decode, Encode};

/// `stampfs rm --skip-trash`: removes the entry at `path` at once, as `Delete` does
/// when the master keeps no trash.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct DeleteNow {
    pub path: String,
    pub recursive: bool,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}

/// `stampfs trash restore`: moves the entry at `path`, in the trash
/// (`/.trash/<user>/<Current or a checkpoint>/...`), to `to`, outside it: the only
/// way out of the trash. `to` must not exist; its parent must. Answers the status of
/// the entry at `to`.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RestoreTrash {
    pub path: String,
    pub to: String,
    /// Who asks (permissions are checked for it; root without one).
    pub caller: Option<Caller>,
}
