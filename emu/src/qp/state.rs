//! The QP state machine: which `ibv_modify_qp` transitions are legal for each QP type, and which
//! attributes each transition requires and permits.
//!
//! One `const` table per QP type, indexed `[current][next]`, as the kernel's
//! `ib_modify_qp_is_ok()` (drivers/infiniband/core/verbs.c) and IBA 11.2.5 / Table 91 define it.
//! A transition is legal when the entry is `valid`, every `required` attribute is in the mask,
//! and nothing outside `required | optional | STATE` is.

use crate::types::{QpAttrMask as M, QpState, QpType};

/// One cell of the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub valid: bool,
    pub required: M,
    pub optional: M,
}

const NO: Transition = Transition { valid: false, required: M::empty(), optional: M::empty() };
const YES: Transition = Transition { valid: true, required: M::empty(), optional: M::empty() };

const fn t(required: M, optional: M) -> Transition {
    Transition { valid: true, required, optional }
}

const fn or(a: M, b: M) -> M {
    M::from_bits_truncate(a.bits() | b.bits())
}

/// Seven states: RESET, INIT, RTR, RTS, SQD, SQE, ERR.
pub type Table = [[Transition; 7]; 7];

// Attribute groups that recur in the tables.
const PKP_AF: M = or(or(M::PKEY_INDEX, M::PORT), M::ACCESS_FLAGS);
const PKP_QK: M = or(or(M::PKEY_INDEX, M::PORT), M::QKEY);
const RTR_UC: M = or(or(M::AV, M::PATH_MTU), or(M::DEST_QPN, M::RQ_PSN));
const RTR_RC: M = or(RTR_UC, or(M::MAX_DEST_RD_ATOMIC, M::MIN_RNR_TIMER));
const RTR_OPT: M = or(or(M::ALT_PATH, M::ACCESS_FLAGS), M::PKEY_INDEX);
const RTS_RC: M =
    or(or(M::TIMEOUT, M::RETRY_CNT), or(or(M::RNR_RETRY, M::SQ_PSN), M::MAX_QP_RD_ATOMIC));
const CUR_ALT_AF_MIG: M = or(or(M::CUR_STATE, M::ALT_PATH), or(M::ACCESS_FLAGS, M::PATH_MIG_STATE));
const CUR_QK: M = or(M::CUR_STATE, M::QKEY);
const SQD_RC: M = or(
    or(or(M::PORT, M::AV), or(M::TIMEOUT, M::RETRY_CNT)),
    or(
        or(or(M::RNR_RETRY, M::MAX_QP_RD_ATOMIC), or(M::MAX_DEST_RD_ATOMIC, M::ALT_PATH)),
        or(or(M::ACCESS_FLAGS, M::PKEY_INDEX), or(M::MIN_RNR_TIMER, M::PATH_MIG_STATE)),
    ),
);
const SQD_UC: M =
    or(or(M::AV, M::ALT_PATH), or(or(M::ACCESS_FLAGS, M::PKEY_INDEX), M::PATH_MIG_STATE));

const RESET: usize = 0;
const INIT: usize = 1;
const RTR: usize = 2;
const RTS: usize = 3;
const SQD: usize = 4;
const SQE: usize = 5;
const ERR: usize = 6;

/// What every QP type shares: any state may go to RESET, and any but RESET to ERR, with no
/// attributes (RESET -> ERR is not a transition in IBA Table 91 nor in the kernel's table).
const fn base() -> Table {
    let mut tb = [[NO; 7]; 7];
    let mut s = 0;
    while s < 7 {
        tb[s][RESET] = YES;
        if s != RESET {
            tb[s][ERR] = YES;
        }
        s += 1;
    }
    tb
}

/// RC: IBA Table 91 / `qp_state_table` entries for `IB_QPT_RC`.
pub const RC: Table = {
    let mut tb = base();
    tb[RESET][INIT] = t(PKP_AF, M::empty());
    tb[INIT][INIT] = t(M::empty(), PKP_AF);
    tb[INIT][RTR] = t(RTR_RC, RTR_OPT);
    tb[RTR][RTS] = t(RTS_RC, or(CUR_ALT_AF_MIG, M::MIN_RNR_TIMER));
    tb[RTS][RTS] = t(M::empty(), or(CUR_ALT_AF_MIG, M::MIN_RNR_TIMER));
    tb[RTS][SQD] = t(M::empty(), M::EN_SQD_ASYNC_NOTIFY);
    tb[SQD][RTS] = t(M::empty(), or(CUR_ALT_AF_MIG, M::MIN_RNR_TIMER));
    tb[SQD][SQD] = t(M::empty(), SQD_RC);
    tb
};

/// UC: as RC without the RDMA-read/atomic and retry attributes; SQE -> RTS exists.
pub const UC: Table = {
    let mut tb = base();
    tb[RESET][INIT] = t(PKP_AF, M::empty());
    tb[INIT][INIT] = t(M::empty(), PKP_AF);
    tb[INIT][RTR] = t(RTR_UC, RTR_OPT);
    tb[RTR][RTS] = t(M::SQ_PSN, CUR_ALT_AF_MIG);
    tb[RTS][RTS] = t(M::empty(), CUR_ALT_AF_MIG);
    tb[RTS][SQD] = t(M::empty(), M::EN_SQD_ASYNC_NOTIFY);
    tb[SQD][RTS] = t(M::empty(), CUR_ALT_AF_MIG);
    tb[SQD][SQD] = t(M::empty(), SQD_UC);
    tb[SQE][RTS] = t(M::empty(), or(M::CUR_STATE, M::ACCESS_FLAGS));
    tb
};

/// UD: Q_Key instead of access flags, no address vector on the QP.
pub const UD: Table = {
    let mut tb = base();
    tb[RESET][INIT] = t(PKP_QK, M::empty());
    tb[INIT][INIT] = t(M::empty(), PKP_QK);
    tb[INIT][RTR] = t(M::empty(), or(M::PKEY_INDEX, M::QKEY));
    tb[RTR][RTS] = t(M::SQ_PSN, CUR_QK);
    tb[RTS][RTS] = t(M::empty(), CUR_QK);
    tb[RTS][SQD] = t(M::empty(), M::EN_SQD_ASYNC_NOTIFY);
    tb[SQD][RTS] = t(M::empty(), CUR_QK);
    tb[SQD][SQD] = t(M::empty(), or(M::PKEY_INDEX, M::QKEY));
    tb[SQE][RTS] = t(M::empty(), CUR_QK);
    tb
};

/// XRC initiator (`IBV_QPT_XRC_SEND`): RC's send side, with no responder attributes
/// (`qp_state_table`, `IB_QPT_XRC_INI`).
pub const XRC_INI: Table = {
    let mut tb = base();
    tb[RESET][INIT] = t(PKP_AF, M::empty());
    tb[INIT][INIT] = t(M::empty(), PKP_AF);
    tb[INIT][RTR] = t(RTR_UC, RTR_OPT);
    tb[RTR][RTS] = t(RTS_RC, CUR_ALT_AF_MIG);
    tb[RTS][RTS] = t(M::empty(), CUR_ALT_AF_MIG);
    tb[RTS][SQD] = t(M::empty(), M::EN_SQD_ASYNC_NOTIFY);
    tb[SQD][RTS] = t(M::empty(), CUR_ALT_AF_MIG);
    tb[SQD][SQD] = t(
        M::empty(),
        M::from_bits_truncate(
            SQD_RC.bits() & !(M::MAX_DEST_RD_ATOMIC.bits() | M::MIN_RNR_TIMER.bits()),
        ),
    );
    tb
};

/// XRC target (`IBV_QPT_XRC_RECV`): RC's receive side, with no retry attributes
/// (`qp_state_table`, `IB_QPT_XRC_TGT`).
pub const XRC_TGT: Table = {
    let mut tb = base();
    tb[RESET][INIT] = t(PKP_AF, M::empty());
    tb[INIT][INIT] = t(M::empty(), PKP_AF);
    tb[INIT][RTR] = t(RTR_RC, RTR_OPT);
    tb[RTR][RTS] = t(or(M::TIMEOUT, M::SQ_PSN), or(CUR_ALT_AF_MIG, M::MIN_RNR_TIMER));
    tb[RTS][RTS] = t(M::empty(), or(CUR_ALT_AF_MIG, M::MIN_RNR_TIMER));
    tb[RTS][SQD] = t(M::empty(), M::EN_SQD_ASYNC_NOTIFY);
    tb[SQD][RTS] = t(M::empty(), or(CUR_ALT_AF_MIG, M::MIN_RNR_TIMER));
    tb[SQD][SQD] = t(
        M::empty(),
        M::from_bits_truncate(
            SQD_RC.bits()
                & !(M::RETRY_CNT.bits() | M::RNR_RETRY.bits() | M::MAX_QP_RD_ATOMIC.bits()),
        ),
    );
    tb
};

/// Raw packet (`IB_QPT_RAW_PACKET`): only the port, at RESET -> INIT; no addressing, PSNs or
/// keys (the frames carry their own headers).
pub const RAW_PACKET: Table = {
    let mut tb = base();
    tb[RESET][INIT] = t(M::PORT, M::empty());
    tb[INIT][INIT] = t(M::empty(), M::PORT);
    tb[INIT][RTR] = YES;
    tb[RTR][RTS] = YES;
    tb[RTS][RTS] = YES;
    tb[RTS][SQD] = t(M::empty(), M::EN_SQD_ASYNC_NOTIFY);
    tb[SQD][RTS] = YES;
    tb[SQD][SQD] = YES;
    tb[SQE][RTS] = t(M::empty(), M::CUR_STATE);
    tb
};

/// Attributes the kernel drops from a modify's mask before checking it, because the QP type
/// has no use for them (`modify_qp_mask` in uverbs_cmd.c): RC-style code can pass them.
pub fn ignored_attrs(qp_type: QpType) -> M {
    match qp_type {
        QpType::XRC_SEND => or(M::MAX_DEST_RD_ATOMIC, M::MIN_RNR_TIMER),
        QpType::XRC_RECV => or(or(M::MAX_QP_RD_ATOMIC, M::RETRY_CNT), M::RNR_RETRY),
        _ => M::empty(),
    }
}

/// The table for a QP type, if the type has one.
pub fn table_for(qp_type: QpType) -> Option<&'static Table> {
    match qp_type {
        QpType::RC => Some(&RC),
        QpType::UC => Some(&UC),
        QpType::UD => Some(&UD),
        QpType::XRC_SEND => Some(&XRC_INI),
        QpType::XRC_RECV => Some(&XRC_TGT),
        QpType::RAW_PACKET => Some(&RAW_PACKET),
        _ => None,
    }
}

/// Why a modify was refused by the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransitionError {
    /// `cur -> next` is not a transition of this QP type.
    Invalid { cur: QpState, next: QpState },
    /// A required attribute is missing from the mask.
    Missing { cur: QpState, next: QpState, missing: M },
    /// The mask names attributes this transition does not accept.
    NotAllowed { cur: QpState, next: QpState, extra: M },
    /// `IBV_QP_CUR_STATE` given in a state where it may not be.
    CurState { cur: QpState },
}

/// `ib_modify_qp_is_ok()`: checks `cur -> next` with `mask` against the table of `qp_type`.
pub fn check(qp_type: QpType, cur: QpState, next: QpState, mask: M) -> Result<(), TransitionError> {
    let tb = table_for(qp_type).ok_or(TransitionError::Invalid { cur, next })?;
    if cur.0 > QpState::ERR.0 || next.0 > QpState::ERR.0 {
        return Err(TransitionError::Invalid { cur, next });
    }
    if mask.contains(M::CUR_STATE)
        && !matches!(cur, QpState::RTR | QpState::RTS | QpState::SQD | QpState::SQE)
    {
        return Err(TransitionError::CurState { cur });
    }
    let e = tb[cur.0 as usize][next.0 as usize];
    if !e.valid {
        return Err(TransitionError::Invalid { cur, next });
    }
    let missing = e.required - mask;
    if !missing.is_empty() {
        return Err(TransitionError::Missing { cur, next, missing });
    }
    let extra = mask - (e.required | e.optional | M::STATE);
    if !extra.is_empty() {
        return Err(TransitionError::NotAllowed { cur, next, extra });
    }
    Ok(())
}

#[cfg(test)]
mod test {
    use super::*;

    const S: [QpState; 7] = [
        QpState::RESET,
        QpState::INIT,
        QpState::RTR,
        QpState::RTS,
        QpState::SQD,
        QpState::SQE,
        QpState::ERR,
    ];

    #[test]
    fn test_rc_connect_path_needs_exact_masks() {
        let init = M::STATE | PKP_AF;
        assert_eq!(check(QpType::RC, QpState::RESET, QpState::INIT, init), Ok(()));
        assert_eq!(
            check(QpType::RC, QpState::RESET, QpState::INIT, M::STATE | M::PORT),
            Err(TransitionError::Missing {
                cur: QpState::RESET,
                next: QpState::INIT,
                missing: M::PKEY_INDEX | M::ACCESS_FLAGS
            })
        );
        let rtr = M::STATE | RTR_RC;
        assert_eq!(check(QpType::RC, QpState::INIT, QpState::RTR, rtr), Ok(()));
        assert!(matches!(
            check(QpType::RC, QpState::INIT, QpState::RTR, rtr | M::SQ_PSN),
            Err(TransitionError::NotAllowed { extra: M::SQ_PSN, .. })
        ));
        assert_eq!(check(QpType::RC, QpState::RTR, QpState::RTS, M::STATE | RTS_RC), Ok(()));
        assert!(check(QpType::RC, QpState::RTR, QpState::RTS, M::STATE | M::SQ_PSN).is_err());
    }

    #[test]
    fn test_every_state_reaches_reset_and_all_but_reset_reach_err() {
        for ty in [QpType::RC, QpType::UC, QpType::UD] {
            for &s in &S {
                assert_eq!(check(ty, s, QpState::RESET, M::STATE), Ok(()), "{ty:?} {s:?}");
                let to_err = check(ty, s, QpState::ERR, M::STATE);
                assert_eq!(to_err.is_ok(), s != QpState::RESET, "{ty:?} {s:?}");
            }
        }
    }

    #[test]
    fn test_skipping_states_is_invalid() {
        for (cur, next) in [
            (QpState::RESET, QpState::RTR),
            (QpState::RESET, QpState::RTS),
            (QpState::INIT, QpState::RTS),
            (QpState::ERR, QpState::INIT),
            (QpState::RTS, QpState::RTR),
            (QpState::RTS, QpState::SQE),
        ] {
            assert!(
                matches!(
                    check(QpType::RC, cur, next, M::STATE),
                    Err(TransitionError::Invalid { .. })
                ),
                "{cur:?}->{next:?}"
            );
        }
    }

    #[test]
    fn test_sqd_and_sqe_columns() {
        assert_eq!(check(QpType::RC, QpState::RTS, QpState::SQD, M::STATE), Ok(()));
        assert_eq!(check(QpType::RC, QpState::SQD, QpState::RTS, M::STATE), Ok(()));
        assert_eq!(check(QpType::RC, QpState::SQD, QpState::SQD, M::STATE | M::TIMEOUT), Ok(()));
        assert!(check(QpType::RC, QpState::SQE, QpState::RTS, M::STATE).is_err());
        assert_eq!(check(QpType::UC, QpState::SQE, QpState::RTS, M::STATE), Ok(()));
        assert_eq!(check(QpType::UD, QpState::SQE, QpState::RTS, M::STATE | M::QKEY), Ok(()));
    }

    #[test]
    fn test_cur_state_only_in_rtr_rts_sqd_sqe() {
        assert_eq!(
            check(QpType::RC, QpState::INIT, QpState::INIT, M::STATE | M::CUR_STATE),
            Err(TransitionError::CurState { cur: QpState::INIT })
        );
        assert_eq!(check(QpType::RC, QpState::RTS, QpState::RTS, M::CUR_STATE), Ok(()));
    }

    #[test]
    fn test_ud_uses_qkey_not_access_flags() {
        assert_eq!(check(QpType::UD, QpState::RESET, QpState::INIT, M::STATE | PKP_QK), Ok(()));
        assert!(check(QpType::UD, QpState::RESET, QpState::INIT, M::STATE | PKP_AF).is_err());
        assert_eq!(check(QpType::UD, QpState::INIT, QpState::RTR, M::STATE), Ok(()));
    }
}
