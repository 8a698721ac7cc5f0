//! A hostile registry (space_testkit::registry's answers, on 127.0.0.1 and
//! 127.0.0.2): wrong, long, short and endless bytes, redirects that would carry the
//! token away or never end, digests that are paths, certificates of another CA,
//! plain HTTP where it is not allowed. Each test names the rule it shows.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use space_registry::{PullOptions, Reference, RegistryError, Timeouts, pull};
use space_testkit::registry::{Answer, Options, TestCa, TestImage, TestRegistry, have_openssl};

fn plain() -> PullOptions {
    PullOptions {
        plain_http: true,
        ..PullOptions::default()
    }
}

/// A pull, which must end within a minute (a defence missing fails the test, it
/// does not hang it).
async fn pull_to(reference: &str, dir: &Path, options: PullOptions) -> Result<(), RegistryError> {
    let reference = Reference::parse(reference).unwrap_or_else(|e| panic!("{e}"));
    let mut quiet = |_: &space_registry::Progress| {};
    let pulled = pull(&reference, dir, options, &mut quiet);
    tokio::time::timeout(Duration::from_secs(60), pulled)
        .await
        .unwrap_or_else(|_| panic!("the pull of {reference} did not end within 60 s"))
        .map(|_| ())
}

fn error_of(r: Result<(), RegistryError>) -> String {
    match r {
        Ok(()) => panic!("the pull succeeded"),
        Err(e) => e.to_string(),
    }
}

/// Every file under `dir` (relative paths), sorted.
fn files(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, p: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if let Ok(rel) = path.strip_prefix(base) {
                out.push(rel.display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A registry with the small image at `test/app:1`; the layer's blob path.
fn registry_with_image() -> (TestRegistry, TestImage, String) {
    let registry = TestRegistry::plain();
    let image = TestImage::small();
    registry.push("test/app", "1", &image);
    let blob = format!("/v2/test/app/blobs/{}", image.layers[0].digest);
    (registry, image, blob)
}

fn reference(r: &TestRegistry) -> String {
    format!("{}/test/app:1", r.address())
}

/// Only the config may be left: no layer, no partial file, no index.
fn assert_no_layer_left(dir: &Path, image: &TestImage) {
    let config = format!("blobs/sha256/{}", &image.config.digest[7..]);
    let left: Vec<String> = files(dir).into_iter().filter(|f| *f != config).collect();
    assert!(left.is_empty(), "left in the layout: {left:?}");
}

#[tokio::test]
async fn a_blob_whose_bytes_do_not_match_its_digest_is_refused_and_nothing_of_it_stays() {
    let (registry, image, blob) = registry_with_image();
    let mut wrong = image.layers[0].bytes.clone();
    let last = wrong.len() - 1;
    wrong[last] ^= 0xff;
    registry.answer(&blob, Answer::Bytes(wrong));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
    assert!(
        e.contains("the bytes received have digest") && e.contains(&image.layers[0].digest),
        "{e}"
    );
    assert_no_layer_left(dir.path(), &image);
}

#[tokio::test]
async fn a_blob_longer_than_its_descriptor_is_refused_by_its_stated_length() {
    let (registry, image, blob) = registry_with_image();
    let mut long = image.layers[0].bytes.clone();
    long.extend_from_slice(b"more");
    registry.answer(&blob, Answer::Bytes(long));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
    assert!(e.contains("more bytes than its descriptor's size"), "{e}");
    assert_no_layer_left(dir.path(), &image);
}

#[tokio::test]
async fn a_blob_longer_than_its_descriptor_is_refused_as_it_streams() {
    let (registry, image, blob) = registry_with_image();
    // Chunked: no length to refuse up front; the bytes past the size are.
    registry.answer(
        &blob,
        Answer::Chunked {
            chunk: image.layers[0].bytes.clone(),
            times: 64,
        },
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
    assert!(e.contains("more bytes than its descriptor's size"), "{e}");
    assert_no_layer_left(dir.path(), &image);
}

#[tokio::test]
async fn a_blob_shorter_than_its_descriptor_is_refused() {
    let (registry, image, blob) = registry_with_image();
    let half = image.layers[0].bytes[..image.layers[0].bytes.len() / 2].to_vec();
    registry.answer(
        &blob,
        Answer::Chunked {
            chunk: half,
            times: 1,
        },
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
    assert!(e.contains("fewer bytes than its descriptor's size"), "{e}");
    assert_no_layer_left(dir.path(), &image);
}

#[tokio::test]
async fn a_huge_manifest_is_refused_at_the_4_mib_bound_with_or_without_a_length() {
    let (registry, _, _) = registry_with_image();
    let manifest = "/v2/test/app/manifests/1";
    for answer in [
        Answer::Chunked {
            chunk: vec![b' '; 1 << 20],
            times: 16,
        },
        Answer::Bytes(vec![b' '; 5 << 20]),
    ] {
        registry.answer(manifest, answer);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
        assert!(e.contains("the manifest 1: more than 4 MiB"), "{e}");
        assert!(files(dir.path()).is_empty());
    }
}

#[tokio::test]
async fn a_redirect_to_another_host_does_not_carry_the_authorization_header() {
    let (registry, image, blob) = registry_with_image();
    // The "CDN": another loopback address, serving the blob without asking for auth.
    let cdn = TestRegistry::start(Options {
        bind: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
        ..Options::default()
    });
    cdn.put_blob(&image.layers[0].bytes);
    registry.answer(
        &blob,
        Answer::Redirect(format!("{}{blob}?signature=1", cdn.origin())),
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    pull_to(&reference(&registry), dir.path(), plain())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The registry got the token (there was one to leak) ...
    assert!(registry.requests().iter().any(
        |r| r.path == blob && r.authorization.as_deref() == Some("Bearer test-registry-token")
    ));
    // ... the CDN got the request, without it.
    let at_cdn = cdn.requests();
    assert_eq!(at_cdn.len(), 1, "{at_cdn:?}");
    assert_eq!(at_cdn[0].path, format!("{blob}?signature=1"));
    assert_eq!(at_cdn[0].authorization, None);
    assert_eq!(at_cdn[0].host.as_deref(), Some(&cdn.address()[..]));
}

#[tokio::test]
async fn a_redirect_loop_ends_after_five_redirects() {
    let (registry, _, blob) = registry_with_image();
    registry.answer(&blob, Answer::Redirect(blob.clone()));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
    assert!(e.contains("more than 5 redirects"), "{e}");
    let asked = registry
        .requests()
        .iter()
        .filter(|r| r.path == blob && r.authorization.is_some())
        .count();
    assert_eq!(asked, 1 + space_registry::MAX_REDIRECTS);
}

#[tokio::test]
async fn a_redirect_from_https_to_plain_http_is_refused() {
    if !have_openssl() {
        eprintln!("SKIPPED: needs the openssl command to make a test CA");
        return;
    }
    let ca = TestCa::make("space registry test CA");
    let registry = TestRegistry::start(Options {
        tls: Some((ca.cert.clone(), ca.key.clone())),
        ..Options::default()
    });
    let image = TestImage::small();
    registry.push("test/app", "1", &image);
    let plain_cdn = TestRegistry::start(Options::default());
    plain_cdn.put_blob(&image.layers[0].bytes);
    let blob = format!("/v2/test/app/blobs/{}", image.layers[0].digest);
    registry.answer(
        &blob,
        Answer::Redirect(format!("{}{blob}", plain_cdn.origin())),
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        ca_file: Some(ca.ca.clone()),
        // Even with plain HTTP allowed to loopback.
        plain_http: false,
        ..PullOptions::default()
    };
    let e = error_of(pull_to(&reference(&registry), dir.path(), options).await);
    assert!(e.contains("refused: to plain HTTP"), "{e}");
    assert!(plain_cdn.requests().is_empty());
}

/// A non-loopback address of this host, if it has one (no packet is sent: a UDP
/// "connection" only picks the source address).
fn non_loopback_address() -> Option<IpAddr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test]
async fn plain_http_to_a_non_loopback_host_is_refused_without_any_connection() {
    let Some(ip) = non_loopback_address() else {
        eprintln!("SKIPPED: this host has no non-loopback address");
        return;
    };
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).unwrap_or_else(|e| panic!("{e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        // Without the rule, the pull would connect and then time out.
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            read: Duration::from_secs(2),
        },
        ..plain()
    };
    let e = error_of(pull_to(&format!("{addr}/test/app:1"), dir.path(), options).await);
    assert!(
        e.contains("plain HTTP is allowed only to a loopback address"),
        "{e}"
    );
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the listener was reached: {other:?}"),
    }
    // A name is refused as well, before it is even resolved.
    let e = error_of(pull_to("registry.example:5000/r:1", dir.path(), plain()).await);
    assert!(e.contains("only to a loopback address"), "{e}");
}

#[tokio::test]
async fn a_token_realm_over_plain_http_elsewhere_is_refused() {
    if !have_openssl() {
        eprintln!("SKIPPED: needs the openssl command to make a test CA");
        return;
    }
    let ca = TestCa::make("space registry test CA");
    let registry = TestRegistry::start(Options {
        token: true,
        tls: Some((ca.cert.clone(), ca.key.clone())),
        // TEST-NET-1: nothing answers there; refused before trying.
        realm: Some("http://192.0.2.1/token".into()),
        ..Options::default()
    });
    registry.push("test/app", "1", &TestImage::small());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        ca_file: Some(ca.ca.clone()),
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            read: Duration::from_secs(2),
        },
        ..PullOptions::default()
    };
    let e = error_of(pull_to(&reference(&registry), dir.path(), options).await);
    assert!(
        e.contains("http://192.0.2.1/token") && e.contains("plain HTTP needs --plain-http"),
        "{e}"
    );
}

#[tokio::test]
async fn a_layer_digest_that_is_a_path_is_refused_before_any_blob_is_asked_for() {
    let registry = TestRegistry::plain();
    let image = TestImage::small().with_manifest(|m| {
        m["layers"][0]["digest"] = "sha256:../../../../../tmp/space-registry-escape".into();
    });
    registry.push("test/app", "1", &image);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let e = error_of(pull_to(&reference(&registry), dir.path(), plain()).await);
    assert!(
        e.contains("layer 1") && e.contains("is not a sha256 digest"),
        "{e}"
    );
    assert!(
        !registry
            .requests()
            .iter()
            .any(|r| r.path.contains("/blobs/"))
    );
    assert!(files(dir.path()).is_empty());
    assert!(!Path::new("/tmp/space-registry-escape").exists());
}

#[tokio::test]
async fn a_manifest_asked_for_by_digest_must_have_that_digest() {
    let (registry, image, _) = registry_with_image();
    // Another image's bytes under this image's digest.
    let other = TestImage::small_for(space_image::oci::host_architecture(), "other\n");
    registry.put_manifest(
        "test/app",
        &image.manifest.digest,
        &other.media_type,
        &other.manifest.bytes,
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let reference = format!("{}/test/app@{}", registry.address(), image.manifest.digest);
    let e = error_of(pull_to(&reference, dir.path(), plain()).await);
    assert!(e.contains(&format!("not {}", image.manifest.digest)), "{e}");
    assert!(files(dir.path()).is_empty());
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    if !have_openssl() {
        eprintln!("SKIPPED: needs the openssl command to make a test CA");
        return;
    }
    let (theirs, ours) = (TestCa::make("their CA"), TestCa::make("our CA"));
    let registry = TestRegistry::start(Options {
        tls: Some((theirs.cert.clone(), theirs.key.clone())),
        ..Options::default()
    });
    registry.push("test/app", "1", &TestImage::small());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        ca_file: Some(ours.ca.clone()),
        ..PullOptions::default()
    };
    let e = error_of(pull_to(&reference(&registry), dir.path(), options).await);
    assert!(e.contains("TLS") && e.contains("certificate"), "{e}");
    assert!(
        registry.requests().is_empty(),
        "a request went over an unverified connection"
    );
}

#[tokio::test]
async fn a_registry_that_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    // Accepts, then says nothing (the connection is held until the test ends).
    let holder = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            read: Duration::from_secs(1),
        },
        ..plain()
    };
    let start = Instant::now();
    let e = error_of(pull_to(&format!("{addr}/test/app:1"), dir.path(), options).await);
    assert!(
        e.contains("no answer within 1 s (waiting for the answer)"),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    drop(holder.join());
}
