//! The connection manager against a confused or lying peer process: whatever CM messages
//! arrive from other nodes, in whatever order, naming whichever ids and ports, nothing panics,
//! and every id stays usable (its events readable, its connection refusable, itself
//! destroyable). Replies the CM sends to those nodes come back to this fabric (it has no host
//! fabric), which confuses it further.

use std::net::SocketAddr;

use proptest::prelude::*;

use super::{
    CmChannel, CmEventType, CmId, ConnParam, PortSpace,
    addr::PortAddress,
    arrived,
    msg::{Msg, Remote},
};
use crate::{Fabric, FabricConfig, QpCap, QpInitAttr, QpType};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn remote() -> impl Strategy<Value = Remote> {
    let words = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>());
    (any::<u8>(), 0u32..10, words, 0u32..3, 0u8..3, any::<[u8; 4]>()).prop_map(
        |(slot, id, (qpn, psn, vendor, options), device, port, b)| Remote {
            slot,
            id,
            qpn,
            psn,
            device,
            port,
            responder_resources: b[0],
            initiator_depth: b[1],
            retry_count: b[2],
            rnr_retry_count: b[3],
            flow_control: b[3] & 1,
            ece_vendor: vendor,
            ece_options: options,
            wire: None,
        },
    )
}

/// Ports the fabric's ids listen on, or nobody does.
fn port() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        Just(addr("127.0.0.2:7490")),
        Just(addr("127.0.0.2:7491")),
        Just(addr("127.0.0.2:7499")),
        Just(addr("127.0.0.1:7490")),
        Just(addr("[::1]:7490")),
    ]
}

fn private() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..300)
}

fn message() -> impl Strategy<Value = Msg> {
    let ps = prop_oneof![Just(PortSpace::Tcp), Just(PortSpace::Udp), Just(PortSpace::Ib)];
    prop_oneof![
        (ps, port(), port(), remote(), private())
            .prop_map(|(ps, src, dst, from, private)| Msg::Req { ps, src, dst, from, private }),
        (0u32..10, remote(), private()).prop_map(|(to, from, private)| Msg::Rep {
            to,
            from,
            private
        }),
        (0u32..10).prop_map(|to| Msg::Rtu { to }),
        (0u32..10, any::<i32>(), private()).prop_map(|(to, reason, private)| Msg::Rej {
            to,
            reason,
            private
        }),
        (0u32..10, 0u32..10).prop_map(|(to, from)| Msg::Dreq { to, from }),
        (0u32..10).prop_map(|to| Msg::Drep { to }),
        (any::<u8>(), 0u32..10).prop_map(|(slot, from)| Msg::Withdrawn { slot, from }),
    ]
}

/// 64 programs, or `PROPTEST_CASES` for a longer run by hand.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn messages_from_a_confused_peer_harm_no_id(
        msgs in prop::collection::vec((any::<u8>(), message(), any::<u8>()), 1..40),
    ) {
        let addresses = PortAddress::parse_list("127.0.0.2=emu1").unwrap();
        let f = Fabric::new(FabricConfig { addresses, ..Default::default() });
        let ch = CmChannel::new(&f).unwrap();
        ch.set_nonblocking(true).unwrap();
        let mut ids = Vec::new();
        for (ps, port) in [(PortSpace::Tcp, 7490), (PortSpace::Udp, 7491)] {
            let l = CmId::create(&ch, ps).unwrap();
            l.bind_addr(addr(&format!("127.0.0.2:{port}"))).unwrap();
            l.listen(4).unwrap();
            ids.push(l);
        }
        // An id connecting with a QP of its own, one looking for a listener nobody is, and
        // one that only resolved its route.
        let ctx = f.devices()[1].open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None, 0).unwrap();
        let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1,
            max_inline_data: 0 };
        for (dst, connect) in [("127.0.0.2:7490", true), ("127.0.0.2:7499", true),
            ("127.0.0.2:7490", false)] {
            let id = CmId::create(&ch, PortSpace::Tcp).unwrap();
            let _ = id.resolve_addr(None, addr(dst), 2000);
            let _ = id.resolve_route(2000);
            if connect {
                if dst.ends_with("7490") {
                    let qp = pd.create_qp(&QpInitAttr::new(QpType::RC, &cq, cap)).unwrap();
                    let _ = id.set_qp(&qp);
                }
                let _ = id.connect(&ConnParam::default());
            }
            ids.push(id);
        }
        for (slot, m, choice) in msgs {
            arrived(&f.0, slot.max(1), &m.encode());
            // What the application does with what it hears: requests accepted or refused,
            // connections ended; every event acknowledged.
            while let Ok(ev) = ch.get_event() {
                match ev.event {
                    CmEventType::ConnectRequest if choice % 3 == 0 => {
                        let _ = ev.id.accept(&ConnParam::default());
                        ids.push(ev.id.clone());
                    }
                    CmEventType::ConnectRequest => {
                        let _ = ev.id.reject(b"no");
                        ids.push(ev.id.clone());
                    }
                    CmEventType::Established if choice % 2 == 0 => {
                        let _ = ev.id.disconnect();
                    }
                    _ => {}
                }
            }
        }
        for id in ids {
            let _ = id.disconnect();
            let _ = id.destroy();
        }
    }
}
