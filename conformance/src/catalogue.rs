//! The verb catalogue: every call of the runner's language, the libibverbs verbs it makes, the
//! objects it needs and makes, when it is valid and what the generator does wrong with it on
//! purpose. `docs/conformance-catalogue.md` is rendered from it (a test keeps the two equal) and
//! the generator draws its calls from it (a test checks each generated verb is catalogued and
//! each catalogued one generated).

/// The kinds of objects a program names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Pd,
    Mr,
    Cq,
    Chan,
    Qp,
    Srq,
    Ah,
    Mw,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pd => "PD",
            Kind::Mr => "MR",
            Kind::Cq => "CQ",
            Kind::Chan => "completion channel",
            Kind::Qp => "QP",
            Kind::Srq => "SRQ",
            Kind::Ah => "AH",
            Kind::Mw => "MW",
        }
    }
}

/// One call of the language.
#[derive(Clone, Copy, Debug)]
pub struct Verb {
    pub name: &'static str,
    /// The call's shape: positional arguments in capitals, then `key=value` options.
    pub syntax: &'static str,
    /// The libibverbs functions it calls.
    pub calls: &'static str,
    pub needs: &'static [Kind],
    pub makes: Option<Kind>,
    /// When the call is valid (object states, QP states).
    pub valid: &'static str,
    /// What the generator gets wrong on purpose with it, and what it prints.
    pub errors: &'static str,
}

use Kind::*;

pub const VERBS: &[Verb] = &[
    Verb {
        name: "query_device",
        syntax: "query_device",
        calls: "ibv_query_device",
        needs: &[],
        makes: None,
        valid: "always",
        errors: "prints the limits programs depend on (max_qp_wr, max_sge, max_cqe, max_srq_wr, atomic_cap, ...)",
    },
    Verb {
        name: "query_port",
        syntax: "query_port [port=N]",
        calls: "ibv_query_port",
        needs: &[],
        makes: None,
        valid: "port 1",
        errors: "prints state, MTUs, table lengths, link layer, max_msg_sz",
    },
    Verb {
        name: "pd",
        syntax: "pd NAME",
        calls: "ibv_alloc_pd",
        needs: &[],
        makes: Some(Pd),
        valid: "always",
        errors: "",
    },
    Verb {
        name: "dealloc_pd",
        syntax: "dealloc_pd PD",
        calls: "ibv_dealloc_pd",
        needs: &[Pd],
        makes: None,
        valid: "no MR, MW, AH, QP or SRQ left in the PD",
        errors: "deallocated while still in use (EBUSY)",
    },
    Verb {
        name: "mr",
        syntax: "mr NAME PD LEN ACCESS",
        calls: "ibv_reg_mr",
        needs: &[Pd],
        makes: Some(Mr),
        valid: "ACCESS from LW|RW|RR|RA|MW|ZB|OD|FG|FP or 0 (OD: on-demand paging, FG/FP: the FLUSH rights, all EINVAL on rxe); remote write or atomic needs LW",
        errors: "remote write/atomic without local write (EINVAL); MRs lacking the access a later WR needs",
    },
    Verb {
        name: "dereg_mr",
        syntax: "dereg_mr MR",
        calls: "ibv_dereg_mr",
        needs: &[Mr],
        makes: None,
        valid: "no memory window bound to it",
        errors: "deregistered with a window bound; later WRs naming its keys",
    },
    Verb {
        name: "cq",
        syntax: "cq NAME CQE [chan=CHAN] [ex]",
        calls: "ibv_create_cq; with ex, ibv_create_cq_ex (the standard WC flags), polled through ibv_start_poll, the ibv_wc_read_* calls and ibv_end_poll",
        needs: &[],
        makes: Some(Cq),
        valid: "1 <= CQE <= max_cqe",
        errors: "",
    },
    Verb {
        name: "resize_cq",
        syntax: "resize_cq CQ CQE",
        calls: "ibv_resize_cq",
        needs: &[Cq],
        makes: None,
        valid: "CQE >= the completions it holds, <= max_cqe",
        errors: "CQE above max_cqe (EINVAL)",
    },
    Verb {
        name: "destroy_cq",
        syntax: "destroy_cq CQ",
        calls: "ibv_destroy_cq",
        needs: &[Cq],
        makes: None,
        valid: "no QP uses it",
        errors: "destroyed while a QP uses it (EBUSY)",
    },
    Verb {
        name: "chan",
        syntax: "chan NAME",
        calls: "ibv_create_comp_channel",
        needs: &[],
        makes: Some(Chan),
        valid: "always",
        errors: "",
    },
    Verb {
        name: "destroy_chan",
        syntax: "destroy_chan CHAN",
        calls: "ibv_destroy_comp_channel",
        needs: &[Chan],
        makes: None,
        valid: "no CQ uses it",
        errors: "destroyed while a CQ uses it (EBUSY)",
    },
    Verb {
        name: "notify",
        syntax: "notify CQ [sol]",
        calls: "ibv_req_notify_cq (inline)",
        needs: &[Cq],
        makes: None,
        valid: "always; one event per arming",
        errors: "",
    },
    Verb {
        name: "cq_event",
        syntax: "cq_event CHAN",
        calls: "ibv_get_cq_event, ibv_ack_cq_events",
        needs: &[Chan],
        makes: None,
        valid: "always; prints the CQ whose event came, or none within the settle time",
        errors: "waits on an unarmed CQ, or a solicited-only arming and an unsolicited completion",
    },
    Verb {
        name: "srq",
        syntax: "srq NAME PD MAX_WR MAX_SGE [limit=N]",
        calls: "ibv_create_srq",
        needs: &[Pd],
        makes: Some(Srq),
        valid: "MAX_WR <= max_srq_wr, MAX_SGE <= max_srq_sge",
        errors: "",
    },
    Verb {
        name: "modify_srq",
        syntax: "modify_srq SRQ [max_wr=N] [limit=N]",
        calls: "ibv_modify_srq",
        needs: &[Srq],
        makes: None,
        valid: "limit < max_wr; arming the limit raises SRQ_LIMIT_REACHED once",
        errors: "a limit at or above the queue's size (EINVAL)",
    },
    Verb {
        name: "query_srq",
        syntax: "query_srq SRQ",
        calls: "ibv_query_srq",
        needs: &[Srq],
        makes: None,
        valid: "always; prints the armed limit",
        errors: "",
    },
    Verb {
        name: "destroy_srq",
        syntax: "destroy_srq SRQ",
        calls: "ibv_destroy_srq",
        needs: &[Srq],
        makes: None,
        valid: "no QP uses it",
        errors: "destroyed while a QP uses it (EBUSY)",
    },
    Verb {
        name: "qp",
        syntax: "qp NAME RC|UC|UD PD SEND_CQ RECV_CQ [srq=SRQ] [sq=N] [rq=N] [ssge=N] [rsge=N] [inline=N] [sigall] [ex]",
        calls: "ibv_create_qp; with ex, ibv_create_qp_ex with every send operation rxe takes for the type (but ATOMIC_WRITE), posted to through the ibv_wr_* calls",
        needs: &[Pd, Cq],
        makes: Some(Qp),
        valid: "capabilities within the device's limits",
        errors: "",
    },
    Verb {
        name: "modify",
        syntax: "modify QP STATE [access=] [dest=QP] [mtu=] [timeout=] [retry=] [rnr_retry=] [min_rnr=] [rd_atomic=] [dest_rd_atomic=] [qkey=] [port=] [pkey=] [sq_psn=] [rq_psn=] [omit=ATTR|...]",
        calls: "ibv_modify_qp",
        needs: &[Qp],
        makes: None,
        valid: "the transitions of ibv_modify_qp(3) with each one's required attributes (filled in per QP type unless omitted)",
        errors: "skipped states, a required attribute omitted, a transition from the wrong state (EINVAL)",
    },
    Verb {
        name: "query_qp",
        syntax: "query_qp QP",
        calls: "ibv_query_qp",
        needs: &[Qp],
        makes: None,
        valid: "always; prints the state (ERR after a failed WR)",
        errors: "",
    },
    Verb {
        name: "destroy_qp",
        syntax: "destroy_qp QP",
        calls: "ibv_destroy_qp",
        needs: &[Qp],
        makes: None,
        valid: "always (a bound type-2 window stays valid)",
        errors: "destroyed while its peer still sends to it",
    },
    Verb {
        name: "ah",
        syntax: "ah NAME PD [port=N] [gid=N] [mcast=N]",
        calls: "ibv_query_gid, ibv_create_ah",
        needs: &[Pd],
        makes: Some(Ah),
        valid: "a GRH to the port's own GID (RoCE), or with mcast to multicast group N",
        errors: "",
    },
    Verb {
        name: "destroy_ah",
        syntax: "destroy_ah AH",
        calls: "ibv_destroy_ah",
        needs: &[Ah],
        makes: None,
        valid: "always",
        errors: "",
    },
    Verb {
        name: "attach_mcast",
        syntax: "attach_mcast QP N [lid=L]",
        calls: "ibv_attach_mcast (the runner also joins the IPv4 group on the host, as librdmacm would, for rxe to loop datagrams back)",
        needs: &[Qp],
        makes: None,
        valid: "a UD QP; group N (0..255) is 239.1.2.N as an IPv4-mapped GID when the port's GID is one, else ff0e::N",
        errors: "a QP not UD (EINVAL); a pair already attached is taken as done",
    },
    Verb {
        name: "detach_mcast",
        syntax: "detach_mcast QP N [lid=L]",
        calls: "ibv_detach_mcast",
        needs: &[Qp],
        makes: None,
        valid: "the (group, LID) pair attached",
        errors: "a pair not attached (EINVAL)",
    },
    Verb {
        name: "mw",
        syntax: "mw NAME PD 1|2",
        calls: "ibv_alloc_mw",
        needs: &[Pd],
        makes: Some(Mw),
        valid: "type 1 or 2",
        errors: "",
    },
    Verb {
        name: "dealloc_mw",
        syntax: "dealloc_mw MW",
        calls: "ibv_dealloc_mw",
        needs: &[Mw],
        makes: None,
        valid: "always (a bound window is invalidated)",
        errors: "later WRs naming its rkey",
    },
    Verb {
        name: "bind_mw",
        syntax: "bind_mw MW QP MR OFF LEN ACCESS [wr=ID] [flags=]",
        calls: "ibv_bind_mw (type 1)",
        needs: &[Mw, Qp, Mr],
        makes: None,
        valid: "a type-1 window, an RC QP in RTS, an MR with MW access, the range inside the MR",
        errors: "a type-2 window, an MR without MW access, a range past the MR",
    },
    Verb {
        name: "post_send",
        syntax: "post_send QP OP [wr=ID] [sge=MR:OFF:LEN,...|none] [lkey=bad] [remote=MR|MW:OFF] [rkey=bad] [flags=sig|sol|inl|fence|0] [imm=N] [add=N] [cmp=N] [swap=N] [inv=MR|MW] [ah=AH dqp=QP|mcast qkey=N] [mw=MW mr=MR off=N len=N access=] [count=N]",
        calls: "ibv_post_send (inline); on an ex QP, ibv_wr_start, the opcode's ibv_wr_* builder, ibv_wr_set_sge for one SGE, ibv_wr_set_sge_list for none or more (with inl, ibv_wr_set_inline_data and ibv_wr_set_inline_data_list), ibv_wr_set_ud_addr, ibv_wr_complete",
        needs: &[Qp],
        makes: None,
        valid: "OP from SEND SEND_IMM WRITE WRITE_IMM READ CAS FAA SEND_INV LOCAL_INV BIND_MW ATOMIC_WRITE as the QP type allows (ATOMIC_WRITE: 8 bytes, which Linux 6.1's rxe fails); the QP in RTS (or SQD)",
        errors: "bad lkeys and rkeys, ranges past the MR or window, missing access rights, misaligned atomics, too many SGEs, a full send queue, the wrong QP type or state, sends without a receive posted (RNR), UD sends to a wrong Q_Key; prints bad= on failure (an ex QP's ibv_wr_complete names none; an OP the QP was not made with: EOPNOTSUPP, its builder being NULL)",
    },
    Verb {
        name: "post_recv",
        syntax: "post_recv QP [wr=ID] [sge=MR:OFF:LEN,...|none] [lkey=bad] [count=N]",
        calls: "ibv_post_recv (inline)",
        needs: &[Qp],
        makes: None,
        valid: "the QP past RESET and without an SRQ",
        errors: "a QP in RESET or with an SRQ, too many SGEs, a full receive queue, buffers too short for what arrives",
    },
    Verb {
        name: "post_srq_recv",
        syntax: "post_srq_recv SRQ [wr=ID] [sge=...] [count=N]",
        calls: "ibv_post_srq_recv (inline)",
        needs: &[Srq],
        makes: None,
        valid: "always",
        errors: "too many SGEs, a full queue",
    },
    Verb {
        name: "poll",
        syntax: "poll CQ [N]",
        calls: "ibv_poll_cq (inline); on an ex CQ, ibv_start_poll and ibv_end_poll around each completion",
        needs: &[Cq],
        makes: None,
        valid: "always; with N, waits for N completions; without, until every signaled WR on the CQ's QPs completed (and, for QPs in ERR, every receive) and the CQ stayed empty for the settle time",
        errors: "prints each completion: QP, wr_id, status, and for a success the opcode, byte_len of receives, imm, inv, grh, the UD source QP",
    },
    Verb {
        name: "events",
        syntax: "events",
        calls: "ibv_get_async_event, ibv_ack_async_event",
        needs: &[],
        makes: None,
        valid: "always; prints the async events that came within the settle time, sorted",
        errors: "",
    },
    Verb {
        name: "fill",
        syntax: "fill MR OFF LEN SEED",
        calls: "(the buffer)",
        needs: &[Mr],
        makes: None,
        valid: "inside the MR; byte i = SEED + i",
        errors: "",
    },
    Verb {
        name: "dump",
        syntax: "dump MR OFF LEN",
        calls: "(the buffer)",
        needs: &[Mr],
        makes: None,
        valid: "inside the MR; prints the bytes in hex",
        errors: "",
    },
];

/// The catalogue entry of `name`.
pub fn verb(name: &str) -> Option<&'static Verb> {
    VERBS.iter().find(|v| v.name == name)
}

/// The catalogue as markdown (`docs/conformance-catalogue.md`).
pub fn render() -> String {
    let mut s = String::from(
        "# The verb catalogue\n\n\
         Rendered from `conformance/src/catalogue.rs` by `cargo run -p rdma-emu-conformance -- catalogue`;\n\
         a test keeps this file equal to it. Each call is one line of a verb program\n\
         (`docs/conformance.md`); the runner executes it through libibverbs.\n\n",
    );
    for v in VERBS {
        let needs: Vec<&str> = v.needs.iter().map(|k| k.name()).collect();
        s.push_str(&format!("## `{}`\n\n    {}\n\n", v.name, v.syntax));
        s.push_str(&format!("- calls: {}\n", v.calls));
        if !needs.is_empty() {
            s.push_str(&format!("- needs: {}\n", needs.join(", ")));
        }
        if let Some(k) = v.makes {
            s.push_str(&format!("- makes: {}\n", k.name()));
        }
        s.push_str(&format!("- valid: {}\n", v.valid));
        if !v.errors.is_empty() {
            s.push_str(&format!("- {}\n", v.errors));
        }
        s.push('\n');
    }
    s
}
