use super::*;
use crate::sniff_fixtures::{CURL_SNI_PYTHONHOSTED, OPENSSL_NO_SNI, OPENSSL_SNI_PYPI, bytes};
use proptest::prelude::*;

fn complete(name: &str) -> Sniff {
    Sniff::Complete(name.into())
}

/// A ClientHello built by hand: TLS 1.2 legacy version, empty session id, one suite,
/// null compression, and the given extensions (type, data).
fn hello(extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.extend([0, 0, 2, 0x13, 0x01, 1, 0]);
    let mut ext = Vec::new();
    for (kind, data) in extensions {
        ext.extend(kind.to_be_bytes());
        ext.extend((data.len() as u16).to_be_bytes());
        ext.extend(data);
    }
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut handshake = vec![1];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    records(&handshake, usize::MAX)
}

/// Wraps a handshake in records of at most `max` bytes each.
fn records(handshake: &[u8], max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in handshake.chunks(max.min(16 * 1024)) {
        out.extend([0x16, 3, 1]);
        out.extend((chunk.len() as u16).to_be_bytes());
        out.extend(chunk);
    }
    out
}

fn sni(names: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (kind, name) in names {
        list.push(*kind);
        list.extend((name.len() as u16).to_be_bytes());
        list.extend(*name);
    }
    let mut data = (list.len() as u16).to_be_bytes().to_vec();
    data.extend(list);
    data
}

#[test]
fn openssl_and_curl_client_hellos_give_their_server_names() {
    assert_eq!(tls_sni(&bytes(OPENSSL_SNI_PYPI)), complete("pypi.org"));
    assert_eq!(
        tls_sni(&bytes(CURL_SNI_PYTHONHOSTED)),
        complete("files.pythonhosted.org")
    );
}

#[test]
fn a_client_hello_without_sni_gives_no_name() {
    assert_eq!(tls_sni(&bytes(OPENSSL_NO_SNI)), Sniff::NoName);
    assert_eq!(
        tls_sni(&hello(&[(16, vec![0, 3, 2, b'h', b'2'])])),
        Sniff::NoName
    );
    assert_eq!(
        tls_sni(&hello(&[(0, sni(&[(7, b"other-type")]))])),
        Sniff::NoName
    );
}

#[test]
fn every_truncation_of_a_real_client_hello_needs_more() {
    for fixture in [OPENSSL_SNI_PYPI, OPENSSL_NO_SNI, CURL_SNI_PYTHONHOSTED] {
        let hello = bytes(fixture);
        for len in 0..hello.len() {
            assert_eq!(tls_sni(&hello[..len]), Sniff::NeedMore, "prefix of {len}");
        }
    }
}

#[test]
fn bytes_after_the_client_hello_are_ignored() {
    let mut b = bytes(OPENSSL_SNI_PYPI);
    b.extend([0x14, 3, 3, 0, 1, 1]); // a ChangeCipherSpec record
    assert_eq!(tls_sni(&b), complete("pypi.org"));
}

#[test]
fn a_client_hello_split_over_records_is_reassembled() {
    let one = hello(&[(0, sni(&[(0, b"Split.Example.")]))]);
    let handshake = &one[5..];
    for max in [1, 3, 4, 17, 60] {
        let split = records(handshake, max);
        assert_eq!(
            tls_sni(&split),
            complete("split.example."),
            "records of {max}"
        );
        assert_eq!(tls_sni(&split[..split.len() - 1]), Sniff::NeedMore);
    }
}

#[test]
fn other_protocols_and_other_records_are_not_tls() {
    assert_eq!(tls_sni(b"GET / HTTP/1.1\r\n"), Sniff::NotThisProtocol);
    assert_eq!(tls_sni(b"SSH-2.0-OpenSSH_9.6\r\n"), Sniff::NotThisProtocol);
    assert_eq!(
        tls_sni(&[0x80, 0x2e, 0x01, 0x00, 0x02]),
        Sniff::NotThisProtocol,
        "SSLv2 hello"
    );
    assert_eq!(
        tls_sni(&[0x17, 3, 3, 0, 1, 0]),
        Sniff::NotThisProtocol,
        "application data"
    );
    assert_eq!(
        tls_sni(&[0x16, 3, 3, 0, 4, 2, 0, 0, 0]),
        Sniff::NotThisProtocol,
        "server hello"
    );
    assert_eq!(
        tls_sni(&[0x16, 3, 3, 0, 0]),
        Sniff::NotThisProtocol,
        "empty record"
    );
    assert_eq!(
        tls_sni(&[0x16, 3, 3, 0x40, 0x01]),
        Sniff::NotThisProtocol,
        "record over 16 KiB"
    );
    assert_eq!(tls_sni(&[0x16, 2, 0]), Sniff::NotThisProtocol, "version 2");
    assert_eq!(
        tls_sni(&[0x16, 3, 9]),
        Sniff::NotThisProtocol,
        "version 3.9"
    );
}

#[test]
fn malformed_server_name_extensions_are_refused() {
    let two_names = sni(&[(0, b"a.example"), (0, b"b.example")]);
    let twice = [
        (0, sni(&[(0, b"a.example")])),
        (0, sni(&[(0, b"a.example")])),
    ];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("two host names", hello(&[(0, two_names)])),
        ("the extension twice", hello(&twice)),
        ("an empty list", hello(&[(0, vec![0, 0])])),
        ("empty data", hello(&[(0, vec![])])),
        ("an empty name", hello(&[(0, sni(&[(0, b"")]))])),
        ("a space in the name", hello(&[(0, sni(&[(0, b"a b")]))])),
        (
            "a NUL in the name",
            hello(&[(0, sni(&[(0, b"a\0.example")]))]),
        ),
        (
            "a non-ASCII name",
            hello(&[(0, sni(&[(0, "ä.example".as_bytes())]))]),
        ),
        (
            "a name of 256 bytes",
            hello(&[(0, sni(&[(0, &[b'a'; 256])]))]),
        ),
    ];
    for (what, b) in cases {
        assert_eq!(tls_sni(&b), Sniff::NotThisProtocol, "{what}");
    }
    assert_eq!(
        tls_sni(&hello(&[(0, sni(&[(0, &[b'a'; 255])]))])),
        complete(&"a".repeat(255))
    );
}

#[test]
fn a_record_length_past_the_bound_is_not_tls_and_the_bound_is_the_peek() {
    let mut huge = vec![0x16, 3, 1, 0x40, 0x00, 1, 0xff, 0xff, 0xff];
    assert_eq!(
        tls_sni(&huge),
        Sniff::NotThisProtocol,
        "handshake of 16 MiB"
    );
    huge = vec![0x16, 3, 1, 0x40, 0x00, 1, 0, 0x40, 0x00];
    huge.resize(MAX_TLS_PEEK + 100, 0);
    assert_eq!(
        tls_sni(&huge),
        Sniff::NotThisProtocol,
        "a second record would pass the bound"
    );
}

#[test]
fn http_host_reads_the_host_header_without_its_port() {
    let cases: &[(&[u8], &str)] = &[
        (b"GET / HTTP/1.1\r\nHost: PyPI.org\r\n\r\n", "pypi.org"),
        (
            b"GET /simple/ HTTP/1.1\r\nUser-Agent: pip\r\nhost:  pypi.org:8080 \r\n\r\n",
            "pypi.org",
        ),
        (
            b"GET / HTTP/1.0\r\nHost: [2001:DB8::1]:80\r\n\r\nbody",
            "2001:db8::1",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: 203.0.113.7\r\n\r\n",
            "203.0.113.7",
        ),
        (
            b"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n",
            "a.example",
        ),
        (b"GET / HTTP/1.1\r\nHost: a.example:\r\n\r\n", "a.example"),
    ];
    for (head, host) in cases {
        assert_eq!(
            http_host(head),
            complete(host),
            "{}",
            String::from_utf8_lossy(head)
        );
    }
}

#[test]
fn an_absolute_form_target_gives_its_authority() {
    assert_eq!(
        http_host(b"GET http://Deb.Example:80/dists HTTP/1.1\r\n\r\n"),
        complete("deb.example")
    );
    assert_eq!(
        http_host(b"GET HTTP://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n"),
        complete("a.example")
    );
    assert_eq!(
        http_host(b"GET http://a.example?q HTTP/1.1\r\n\r\n"),
        complete("a.example")
    );
}

#[test]
fn a_request_without_host_gives_no_name() {
    assert_eq!(http_host(b"GET / HTTP/1.0\r\n\r\n"), Sniff::NoName);
    assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost:\r\n\r\n"), Sniff::NoName);
}

#[test]
fn ambiguous_or_malformed_request_heads_are_refused() {
    let cases: &[(&str, &[u8])] = &[
        (
            "two Host headers",
            b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        ),
        (
            "target and Host differ",
            b"GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n",
        ),
        (
            "userinfo",
            b"GET http://a.example@b.example/ HTTP/1.1\r\n\r\n",
        ),
        (
            "userinfo in Host",
            b"GET / HTTP/1.1\r\nHost: a.example@b.example\r\n\r\n",
        ),
        ("https target", b"GET https://a.example/ HTTP/1.1\r\n\r\n"),
        ("empty authority", b"GET http:/// HTTP/1.1\r\n\r\n"),
        (
            "CONNECT",
            b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n",
        ),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        ("HTTP/0.9", b"GET /\r\n\r\n"),
        (
            "obsolete folding",
            b"GET / HTTP/1.1\r\nX: a\r\n b\r\nHost: a.example\r\n\r\n",
        ),
        (
            "space before colon",
            b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n",
        ),
        ("bare LF", b"GET / HTTP/1.1\nHost: a.example\r\n\r\n"),
        ("bare CR", b"GET / HTTP/1.1\r\nHost: a\rb.example\r\n\r\n"),
        (
            "a control byte in a value",
            b"GET / HTTP/1.1\r\nHost: a.example\r\nX: \x01\r\n\r\n",
        ),
        (
            "a bad port",
            b"GET / HTTP/1.1\r\nHost: a.example:80x\r\n\r\n",
        ),
        (
            "a port of 6 digits",
            b"GET / HTTP/1.1\r\nHost: a.example:100000\r\n\r\n",
        ),
        (
            "a slash in Host",
            b"GET / HTTP/1.1\r\nHost: a.example/x\r\n\r\n",
        ),
        ("unbracketed IPv6", b"GET / HTTP/1.1\r\nHost: ::1\r\n\r\n"),
        ("two spaces", b"GET  / HTTP/1.1\r\nHost: a.example\r\n\r\n"),
    ];
    for (what, head) in cases {
        assert_eq!(http_host(head), Sniff::NotThisProtocol, "{what}");
    }
}

#[test]
fn a_partial_head_needs_more_until_the_bound() {
    let head = b"GET /simple/requests/ HTTP/1.1\r\nHost: pypi.org\r\nAccept: */*\r\n\r\n";
    for len in 0..head.len() {
        assert_eq!(http_host(&head[..len]), Sniff::NeedMore, "prefix of {len}");
    }
    let mut long = b"GET / HTTP/1.1\r\nX: ".to_vec();
    long.resize(MAX_HTTP_HEAD, b'a');
    assert_eq!(http_host(&long), Sniff::NotThisProtocol);
    long.truncate(MAX_HTTP_HEAD - 1);
    assert_eq!(http_host(&long), Sniff::NeedMore);
}

#[test]
fn non_http_first_bytes_are_refused_at_once() {
    assert_eq!(http_host(&bytes(OPENSSL_SNI_PYPI)), Sniff::NotThisProtocol);
    assert_eq!(
        http_host(b"SSH-2.0-OpenSSH_9.6\r\n"),
        Sniff::NotThisProtocol
    );
    assert_eq!(http_host(b"\x00"), Sniff::NotThisProtocol);
    assert_eq!(
        http_host(&[b'A'; 33]),
        Sniff::NotThisProtocol,
        "a method of 33 characters"
    );
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_either_sniffer(b in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = tls_sni(&b);
        let _ = http_host(&b);
    }

    #[test]
    fn arbitrary_bytes_after_a_handshake_record_header_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..600),
        len in 0u16..700,
    ) {
        let mut b = vec![0x16, 3, 1];
        b.extend(len.to_be_bytes());
        b.push(1);
        b.extend(tail);
        let _ = tls_sni(&b);
    }

    #[test]
    fn a_truncated_hand_built_hello_needs_more(name in "[a-z]{1,20}(\\.[a-z]{1,20}){0,4}", cut: prop::sample::Index) {
        let b = hello(&[(10, vec![0, 2, 0, 29]), (0, sni(&[(0, name.as_bytes())])), (43, vec![2, 3, 4])]);
        prop_assert_eq!(tls_sni(&b), Sniff::Complete(name.clone()));
        let cut = cut.index(b.len());
        prop_assert_eq!(tls_sni(&b[..cut]), Sniff::NeedMore);
    }

    #[test]
    fn a_truncated_request_head_needs_more(host in "[a-z]{1,20}(\\.[a-z]{1,20}){0,4}", cut: prop::sample::Index) {
        let head = format!("GET /x HTTP/1.1\r\nAccept: */*\r\nHost: {host}:80\r\n\r\n");
        prop_assert_eq!(http_host(head.as_bytes()), Sniff::Complete(host.clone()));
        let cut = cut.index(head.len());
        prop_assert_eq!(http_host(&head.as_bytes()[..cut]), Sniff::NeedMore);
    }
}
