use super::*;
use proptest::prelude::*;

/// A query as `dig` sends it (written by hand from RFC 1035 / RFC 6891): id 0x1a2b,
/// RD and AD set, `PyPI.org A IN`, and an EDNS OPT record (UDP size 1232).
const DIG_QUERY: &[u8] = &[
    0x1a, 0x2b, 0x01, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // header
    4, b'P', b'y', b'P', b'I', 3, b'o', b'r', b'g', 0, 0x00, 0x01, 0x00, 0x01, // question
    0x00, 0x00, 0x29, 0x04, 0xd0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // OPT
];

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn a_query_with_edns_is_parsed_and_its_name_lowercased() {
    let q = parse_query(DIG_QUERY).unwrap();
    assert_eq!((q.id, q.recursion_desired), (0x1a2b, true));
    assert_eq!(
        (q.name.as_str(), q.qtype, q.qclass),
        ("pypi.org", TYPE_A, CLASS_IN)
    );
}

#[test]
fn an_answer_echoes_the_question_as_sent_and_carries_the_addresses() {
    let q = parse_query(DIG_QUERY).unwrap();
    let a = answer(
        &q,
        &[ip("203.0.113.7"), ip("2001:db8::7"), ip("203.0.113.8")],
        60,
    );
    assert_eq!(&a[12..26], &DIG_QUERY[12..26], "the question, case kept");
    let r = parse_response(&a).unwrap();
    assert_eq!(r.id, 0x1a2b);
    assert_eq!(r.rcode, Rcode::NoError);
    assert_eq!(
        r.addresses,
        vec![(ip("203.0.113.7"), 60), (ip("203.0.113.8"), 60)]
    );
}

#[test]
fn an_aaaa_query_gets_only_the_ipv6_addresses() {
    let q = parse_query(&build_query(7, "files.pythonhosted.org.", TYPE_AAAA).unwrap()).unwrap();
    let r = parse_response(&answer(&q, &[ip("203.0.113.7"), ip("2001:db8::7")], 300)).unwrap();
    assert_eq!(r.addresses, vec![(ip("2001:db8::7"), 300)]);
}

#[test]
fn another_type_gets_no_data_and_a_refused_name_its_code() {
    let q = parse_query(&build_query(9, "pypi.org", 65).unwrap()).unwrap();
    let r = parse_response(&answer(&q, &[ip("203.0.113.7")], 60)).unwrap();
    assert_eq!((r.rcode, r.addresses.len()), (Rcode::NoError, 0));
    for rcode in [Rcode::NxDomain, Rcode::Refused] {
        let r = parse_response(&reply_without_records(&q, rcode)).unwrap();
        assert_eq!((r.id, r.rcode, r.addresses.len()), (9, rcode, 0));
    }
}

#[test]
fn an_answer_never_passes_512_bytes() {
    let long = format!(
        "{}.{}.{}.example",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63)
    );
    let q = parse_query(&build_query(1, &long, TYPE_AAAA).unwrap()).unwrap();
    let many: Vec<IpAddr> = (0..100u16)
        .map(|i| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i)))
        .collect();
    let a = answer(&q, &many, 60);
    assert!(a.len() <= MAX_UDP_MESSAGE, "{}", a.len());
    let r = parse_response(&a).unwrap();
    assert_eq!(
        r.addresses.len(),
        (MAX_UDP_MESSAGE - 12 - (long.len() + 2) - 4) / 28
    );
    assert_eq!(r.addresses[0].0, many[0]);
}

#[test]
fn each_malformed_query_is_refused_with_its_reason() {
    let good = build_query(1, "a.example", TYPE_A).unwrap();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut m = good.clone();
        f(&mut m);
        m
    };
    let cases: Vec<(Vec<u8>, DnsError)> = vec![
        (good[..11].to_vec(), DnsError::TooShort),
        (good[..good.len() - 1].to_vec(), DnsError::TooShort),
        (with(&|m| m.resize(513, 0)), DnsError::TooLong),
        (with(&|m| m[2] |= 0x80), DnsError::WrongDirection),
        (with(&|m| m[2] |= 0x10), DnsError::Opcode(2)),
        (with(&|m| m[2] |= 0x02), DnsError::Truncated),
        (with(&|m| m[5] = 2), DnsError::QuestionCount(2)),
        (with(&|m| m[5] = 0), DnsError::QuestionCount(0)),
        (with(&|m| m[7] = 1), DnsError::UnexpectedRecords),
        (with(&|m| m[11] = 2), DnsError::UnexpectedRecords),
        (with(&|m| m[12] = 0xc0), DnsError::Compression),
        (with(&|m| m[12] = 0x41), DnsError::LabelType),
        (with(&|m| m[13] = b' '), DnsError::BadName),
        (with(&|m| m[13] = b'.'), DnsError::BadName),
        (with(&|m| m[13] = 0xe4), DnsError::BadName),
        (with(&|m| m.push(0)), DnsError::TrailingBytes),
    ];
    for (msg, error) in cases {
        assert_eq!(parse_query(&msg), Err(error.clone()), "{error}");
    }
}

#[test]
fn a_name_of_255_wire_bytes_is_accepted_and_256_refused() {
    let label = "a".repeat(63);
    // 4 labels of 63 → 256 bytes on the wire; the last one shortened to 62 → 255.
    let ok = format!("{label}.{label}.{label}.{}", "a".repeat(61));
    assert_eq!(
        parse_query(&build_query(1, &ok, TYPE_A).unwrap())
            .unwrap()
            .name,
        ok
    );
    let mut msg = build_query(1, &ok, TYPE_A).unwrap();
    let at = 12 + 3 * 64;
    msg[at] = 62;
    msg.insert(at + 1, b'a');
    assert_eq!(parse_query(&msg), Err(DnsError::NameTooLong));
    assert_eq!(
        build_query(
            1,
            &format!("{label}.{label}.{label}.{}", "a".repeat(62)),
            TYPE_A
        ),
        Err(DnsError::NameTooLong)
    );
}

#[test]
fn a_header_only_error_reply_keeps_the_id_and_answers_no_response() {
    let mut bad = build_query(0x4242, "a.example", TYPE_A).unwrap();
    bad[5] = 3;
    let reply = error_reply(&bad, Rcode::FormErr).unwrap();
    let r = parse_response(&reply).unwrap();
    assert_eq!((r.id, r.rcode), (0x4242, Rcode::FormErr));
    assert_eq!(
        error_reply(&reply, Rcode::FormErr),
        None,
        "never answer a response"
    );
    assert_eq!(error_reply(&bad[..5], Rcode::FormErr), None);
}

#[test]
fn a_response_with_compressed_names_and_other_records_gives_its_addresses() {
    // Question a.example A; answers: CNAME a.example → b.example (pointer), then A of
    // b.example as a pointer into the CNAME's data.
    let mut m = vec![0, 5, 0x81, 0x80, 0, 1, 0, 2, 0, 0, 0, 0];
    m.extend([1, b'a', 7]);
    m.extend(b"example");
    m.extend([0, 0, 1, 0, 1]);
    m.extend([0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 30, 0, 4, 1, b'b', 0xc0, 14]);
    let cname_data = m.len() - 4;
    m.extend([
        0xc0,
        cname_data as u8,
        0,
        1,
        0,
        1,
        0,
        0,
        0,
        30,
        0,
        4,
        203,
        0,
        113,
        9,
    ]);
    let r = parse_response(&m).unwrap();
    assert_eq!(r.addresses, vec![(ip("203.0.113.9"), 30)]);
    m.truncate(m.len() - 1);
    assert_eq!(parse_response(&m), Err(DnsError::TooShort));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_parsers(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_query(&b);
        let _ = parse_response(&b);
        let _ = error_reply(&b, Rcode::FormErr);
    }

    #[test]
    fn a_mutated_query_never_panics_and_its_answer_always_parses(
        name in "[a-zA-Z0-9-]{1,30}(\\.[a-zA-Z0-9-]{1,30}){0,5}",
        qtype in prop_oneof![Just(TYPE_A), Just(TYPE_AAAA), any::<u16>()],
        flip in any::<(prop::sample::Index, u8)>(),
        addrs in proptest::collection::vec(any::<[u8; 4]>(), 0..40),
        ttl: u32,
    ) {
        let mut msg = build_query(3, &name, qtype).unwrap();
        let q = parse_query(&msg).unwrap();
        prop_assert_eq!(&q.name, &name.to_ascii_lowercase());
        let addrs: Vec<IpAddr> = addrs.into_iter().map(IpAddr::from).collect();
        let a = answer(&q, &addrs, ttl);
        prop_assert!(a.len() <= MAX_UDP_MESSAGE);
        let r = parse_response(&a).unwrap();
        if qtype == TYPE_A {
            prop_assert!(r.addresses.iter().all(|(addr, t)| addrs.contains(addr) && *t == ttl));
            prop_assert!(!r.addresses.is_empty() || addrs.is_empty());
        } else {
            prop_assert!(r.addresses.is_empty());
        }
        let i = flip.0.index(msg.len());
        msg[i] ^= flip.1;
        if let Ok(q) = parse_query(&msg) {
            prop_assert!(parse_response(&reply_without_records(&q, Rcode::Refused)).is_ok());
        }
    }
}
