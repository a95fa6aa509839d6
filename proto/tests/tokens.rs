//! Fencing tokens and signed commands, property-tested: a genuine one verifies, and
//! changing anything the MAC covers, or the key, makes it fail. Tokens also survive the
//! wire: what verifies before a round trip through the codec verifies after it.

mod common;

use bytes::Bytes;
use common::*;
use proptest::prelude::*;
use stampfs_proto::*;

prop_compose! {
    fn arb_key()(bytes in any::<[u8; 32]>()) -> ClusterKey {
        ClusterKey::from_bytes(bytes)
    }
}

/// Which single change to make to a token.
#[derive(Clone, Debug)]
enum Tamper {
    Handle(u64),
    Version(u64),
    Client(u64),
    /// XOR one MAC byte with a non-zero mask.
    Mac(usize, u8),
}

fn arb_tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        arb_u64().prop_map(Tamper::Handle),
        arb_u64().prop_map(Tamper::Version),
        arb_u64().prop_map(Tamper::Client),
        (0usize..32, 1u8..=255).prop_map(|(i, m)| Tamper::Mac(i, m)),
    ]
}

/// Applies `t`, returning `None` when it would not change the token (the same value).
fn tamper(token: ChunkToken, t: &Tamper) -> Option<ChunkToken> {
    let mut out = token;
    match *t {
        Tamper::Handle(h) => out.handle = ChunkHandle(h),
        Tamper::Version(v) => out.version = ChunkVersion(v),
        Tamper::Client(c) => out.client = ClientId(c),
        Tamper::Mac(i, m) => out.mac[i] ^= m,
    }
    (out != token).then_some(out)
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn a_signed_token_verifies(key in arb_key(), h in arb_handle(), v in arb_version(),
                               c in arb_client()) {
        let t = ChunkToken::sign(&key, h, v, c);
        prop_assert_eq!((t.handle, t.version, t.client), (h, v, c));
        prop_assert!(t.verify(&key).is_ok());
        // Signing is deterministic: the master can re-sign the same grant.
        prop_assert_eq!(t, ChunkToken::sign(&key, h, v, c));
    }

    #[test]
    fn changing_any_one_field_or_mac_byte_fails(key in arb_key(), h in arb_handle(),
                                                v in arb_version(), c in arb_client(),
                                                change in arb_tamper()) {
        let t = ChunkToken::sign(&key, h, v, c);
        if let Some(bad) = tamper(t, &change) {
            match bad.verify(&key) {
                Err(Error::BadToken { handle }) => prop_assert_eq!(handle, bad.handle),
                other => {
                    return Err(TestCaseError::fail(format!("{change:?} gave {other:?}")))
                }
            }
            prop_assert_eq!(
                bad.verify(&key).map_err(|e| e.code()).err(),
                Some(ErrorCode::BadToken)
            );
        }
    }

    /// A raised version is the attack fencing exists for: never accepted.
    #[test]
    fn a_client_cannot_raise_its_version(key in arb_key(), h in arb_handle(),
                                         v in 0u64..u64::MAX, c in arb_client()) {
        let mut t = ChunkToken::sign(&key, h, ChunkVersion(v), c);
        t.version = ChunkVersion(v).next();
        prop_assert!(t.verify(&key).is_err());
    }

    #[test]
    fn a_token_from_another_key_fails(a in arb_key(), b in arb_key(), h in arb_handle(),
                                      v in arb_version(), c in arb_client()) {
        prop_assume!(a != b);
        let t = ChunkToken::sign(&a, h, v, c);
        let res = t.verify(&b);
        prop_assert!(matches!(res, Err(Error::BadToken { .. })), "{:?}", res);
        prop_assert_ne!(t.mac, ChunkToken::sign(&b, h, v, c).mac);
    }

    #[test]
    fn tokens_verify_after_the_wire(key in arb_key(), h in arb_handle(), v in arb_version(),
                                    c in arb_client(), pipe in arb_pipe()) {
        let t = ChunkToken::sign(&key, h, v, c);
        let frame = Frame::new(&t, Bytes::new()).map_err(fail)?;
        let got = through_pipe(&[frame], pipe).map_err(fail)?;
        prop_assert_eq!(got.len(), 1);
        let back: ChunkToken = got[0].decode().map_err(fail)?;
        prop_assert_eq!(back, t);
        prop_assert!(back.verify(&key).is_ok());
    }

    #[test]
    fn signed_commands_verify_and_any_change_fails(key in arb_key(), other in arb_key(),
                                                   issue in arb_issue(),
                                                   other_issue in arb_issue(),
                                                   cmd in arb_chunk_command(),
                                                   changed in arb_chunk_command(),
                                                   byte in 0usize..32, mask in 1u8..=255) {
        let s = Signed::new(&key, issue, cmd.clone()).map_err(fail)?;
        prop_assert_eq!(s.clone().verify(&key).map_err(fail)?, (issue, cmd.clone()));

        if other_issue != issue {
            let renumbered = Signed { issue: other_issue, ..s.clone() };
            let res = renumbered.verify(&key);
            prop_assert!(matches!(res, Err(Error::BadCommandMac)), "{:?}", res);
        }

        let mut bad = s.clone();
        bad.mac[byte] ^= mask;
        let res = bad.verify(&key);
        prop_assert!(matches!(res, Err(Error::BadCommandMac)), "{:?}", res);

        if changed != cmd {
            let swapped = Signed { issue, body: changed, mac: s.mac };
            let res = swapped.verify(&key);
            prop_assert!(matches!(res, Err(Error::BadCommandMac)), "{:?}", res);
        }
        if other != key {
            let res = s.verify(&other);
            prop_assert!(matches!(res, Err(Error::BadCommandMac)), "{:?}", res);
        }
    }

    /// The two MAC domains never mix: a token's MAC is not a valid command MAC over the
    /// token's own fields, whatever they are.
    #[test]
    fn a_token_mac_never_signs_a_command(key in arb_key(), h in arb_handle(),
                                         v in arb_version(), c in arb_client(),
                                         issue in arb_issue()) {
        let t = ChunkToken::sign(&key, h, v, c);
        let forged = Signed {
            issue,
            body: DigestReplica { handle: t.handle, version: t.version },
            mac: t.mac,
        };
        prop_assert!(forged.verify(&key).is_err());
        let forged = Signed {
            issue,
            body: ChunkCommand::BumpVersion { handle: h, version: v, create: false },
            mac: t.mac,
        };
        prop_assert!(forged.verify(&key).is_err());
    }
}
