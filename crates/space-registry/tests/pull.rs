//! Pulls from a registry the test starts on 127.0.0.1 (space_testkit::registry),
//! which requires a bearer token from its own token endpoint: over plain HTTP, over
//! HTTPS with a test CA, an index's platform, Docker media types, credentials; each
//! layout written is imported by space-image's own importer.

use std::path::Path;

use space_image::Store;
use space_registry::{Credentials, Platform, Progress, PullOptions, Pulled, Reference, pull};
use space_testkit::registry::{MediaTypes, Options, TestCa, TestImage, TestRegistry, have_openssl};

fn plain() -> PullOptions {
    PullOptions {
        plain_http: true,
        ..PullOptions::default()
    }
}

/// Pulls `reference` into `dir`, gathering the progress told.
async fn pull_to(
    reference: &str,
    dir: &Path,
    options: PullOptions,
) -> (space_registry::Result<Pulled>, Vec<Progress>) {
    let reference = Reference::parse(reference).unwrap_or_else(|e| panic!("{e}"));
    let mut told = Vec::new();
    let got = pull(&reference, dir, options, &mut |p: &Progress| {
        told.push(p.clone())
    })
    .await;
    (got, told)
}

/// The layout at `dir` imported by space-image: `path`'s contents in its top layer.
fn import_and_read(dir: &Path, path: &str) -> String {
    let store_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(store_dir.path()).unwrap_or_else(|e| panic!("{e}"));
    store
        .import_archive(dir, "pulled:1")
        .unwrap_or_else(|e| panic!("import of the pulled layout: {e}"));
    let resolved = store.resolve("pulled:1").unwrap_or_else(|e| panic!("{e}"));
    let top = resolved
        .lower_dirs
        .first()
        .unwrap_or_else(|| panic!("no layer"));
    std::fs::read_to_string(top.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test]
async fn a_pull_over_plain_http_gets_a_token_and_writes_a_layout_the_importer_takes() {
    let registry = TestRegistry::plain();
    let image = TestImage::small();
    registry.push("test/app", "1", &image);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let reference = format!("{}/test/app:1", registry.address());
    let (got, told) = pull_to(&reference, dir.path(), plain()).await;
    let got = got.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.digest.to_string(), image.manifest.digest);
    assert_eq!(got.layers, 1);
    // The token was fetched, then used.
    let requests = registry.requests();
    assert!(
        requests.iter().any(|r| r.path.starts_with("/token?")),
        "{requests:?}"
    );
    assert!(
        requests.iter().any(|r| r.path.contains("/blobs/")
            && r.authorization.as_deref() == Some("Bearer test-registry-token")),
        "{requests:?}"
    );
    // Progress: what is fetched, then every blob to its end.
    assert!(
        matches!(told.first(), Some(Progress::Resolved { layers: 1, .. })),
        "{told:?}"
    );
    let layer = &image.layers[0];
    assert!(told.iter().any(
        |p| matches!(p, Progress::Blob { digest, received, size, .. }
        if digest.to_string() == layer.digest && received == size)
    ));
    // An OCI layout: the manifest as the registry sent it, named by the tag.
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("index.json")).unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        index["manifests"][0]["digest"],
        image.manifest.digest.as_str()
    );
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        "1"
    );
    assert!(dir.path().join("oci-layout").is_file());
    assert_eq!(
        import_and_read(dir.path(), "hello.txt"),
        "hello from the registry\n"
    );
}

#[tokio::test]
async fn a_pull_over_https_trusts_the_test_ca_given_with_ca_file() {
    if !have_openssl() {
        eprintln!("SKIPPED: needs the openssl command to make a test CA");
        return;
    }
    let ca = TestCa::make("space registry test CA");
    let registry = TestRegistry::start(Options {
        token: true,
        tls: Some((ca.cert.clone(), ca.key.clone())),
        ..Options::default()
    });
    let image = TestImage::small();
    registry.push("test/app", "1", &image);
    for host in ["127.0.0.1", "localhost"] {
        let port = registry
            .address()
            .rsplit_once(':')
            .map(|(_, p)| p.to_owned());
        let reference = format!("{host}:{}/test/app:1", port.unwrap_or_default());
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let options = PullOptions {
            ca_file: Some(ca.ca.clone()),
            ..PullOptions::default()
        };
        let (got, _) = pull_to(&reference, dir.path(), options).await;
        let got = got.unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(got.digest.to_string(), image.manifest.digest);
        assert_eq!(
            import_and_read(dir.path(), "hello.txt"),
            "hello from the registry\n"
        );
    }
    // The token came over HTTPS too (the realm is the registry's https origin).
    assert!(registry.origin().starts_with("https://"));
    assert!(
        registry
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/token?"))
    );
}

#[tokio::test]
async fn an_index_with_two_platforms_gives_the_platform_asked_for() {
    let registry = TestRegistry::plain();
    let amd = TestImage::small_for("amd64", "amd64\n");
    let arm = TestImage::small_for("arm64", "arm64\n");
    registry.push_index(
        "multi/app",
        "1",
        &[("linux/amd64", &amd), ("linux/arm64", &arm)],
    );
    let reference = format!("{}/multi/app:1", registry.address());
    for (platform, image, hello) in [
        ("linux/arm64", &arm, "arm64\n"),
        ("linux/amd64", &amd, "amd64\n"),
    ] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let options = PullOptions {
            platform: platform.parse().unwrap_or_else(|e| panic!("{e}")),
            ..plain()
        };
        let (got, _) = pull_to(&reference, dir.path(), options).await;
        let got = got.unwrap_or_else(|e| panic!("{platform}: {e}"));
        assert_eq!(got.digest.to_string(), image.manifest.digest, "{platform}");
        assert_eq!(got.platform, platform);
        let hex = &image.layers[0].digest["sha256:".len()..];
        assert!(dir.path().join("blobs/sha256").join(hex).is_file());
        // Only the chosen platform's layer was fetched.
        let other = if image.architecture == "arm64" {
            &amd
        } else {
            &arm
        };
        let other_hex = &other.layers[0].digest["sha256:".len()..];
        assert!(!dir.path().join("blobs/sha256").join(other_hex).exists());
        assert_eq!(import_and_read(dir.path(), "hello.txt"), hello);
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        platform: Platform {
            os: "linux".into(),
            architecture: "riscv64".into(),
            variant: None,
        },
        ..plain()
    };
    let (got, _) = pull_to(&reference, dir.path(), options).await;
    let e = got.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        e.contains("no manifest for linux/riscv64") && e.contains("linux/amd64, linux/arm64"),
        "{e}"
    );
}

#[tokio::test]
async fn an_image_with_docker_media_types_is_pulled_as_it_is() {
    let registry = TestRegistry::plain();
    let layer = space_testkit::registry::LayerBuilder::new()
        .file("docker.txt", b"docker media types\n", 0o644)
        .finish();
    let image = TestImage::build(
        space_image::oci::host_architecture(),
        MediaTypes::Docker,
        vec![layer],
    );
    registry.push("test/docker", "v2", &image);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let reference = format!("{}/test/docker:v2", registry.address());
    let (got, _) = pull_to(&reference, dir.path(), plain()).await;
    let got = got.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        got.media_type,
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    // The manifest's digest is the registry's: its bytes were kept.
    assert_eq!(got.digest.to_string(), image.manifest.digest);
    assert_eq!(
        import_and_read(dir.path(), "docker.txt"),
        "docker media types\n"
    );
}

#[tokio::test]
async fn a_pull_by_digest_gets_that_manifest() {
    let registry = TestRegistry::plain();
    let image = TestImage::small();
    registry.push("test/app", "1", &image);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let reference = format!("{}/test/app@{}", registry.address(), image.manifest.digest);
    let (got, _) = pull_to(&reference, dir.path(), plain()).await;
    assert_eq!(
        got.unwrap_or_else(|e| panic!("{e}")).digest.to_string(),
        image.manifest.digest
    );
    assert!(
        registry
            .requests()
            .iter()
            .any(|r| r.path == format!("/v2/test/app/manifests/{}", image.manifest.digest))
    );
}

#[tokio::test]
async fn credentials_go_to_the_token_endpoint_as_basic_auth_and_none_means_refused() {
    let registry = TestRegistry::start(Options {
        token: true,
        basic: Some(("alice".into(), "s3cret".into())),
        ..Options::default()
    });
    let image = TestImage::small();
    registry.push("private/app", "1", &image);
    let reference = format!("{}/private/app:1", registry.address());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = pull_to(&reference, dir.path(), plain()).await;
    let e = got.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("authentication") && e.contains("401"), "{e}");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        credentials: Some(Credentials::new("alice", "s3cret").unwrap_or_else(|e| panic!("{e}"))),
        ..plain()
    };
    let (got, _) = pull_to(&reference, dir.path(), options).await;
    got.unwrap_or_else(|e| panic!("{e}"));
    let basic = registry
        .requests()
        .into_iter()
        .filter(|r| {
            r.authorization
                .as_deref()
                .is_some_and(|a| a.starts_with("Basic "))
        })
        .map(|r| r.path)
        .collect::<Vec<_>>();
    assert!(
        !basic.is_empty() && basic.iter().all(|p| p.starts_with("/token?")),
        "{basic:?}"
    );
}

#[tokio::test]
async fn a_basic_challenge_takes_the_credentials_on_the_registry_itself() {
    let registry = TestRegistry::start(Options {
        basic: Some(("bob".into(), "pw".into())),
        basic_challenge: true,
        ..Options::default()
    });
    let image = TestImage::small();
    registry.push("private/app", "1", &image);
    let reference = format!("{}/private/app:1", registry.address());
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (got, _) = pull_to(&reference, dir.path(), plain()).await;
    let e = got.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("asks for a user and a password"), "{e}");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let options = PullOptions {
        credentials: Some(Credentials::new("bob", "pw").unwrap_or_else(|e| panic!("{e}"))),
        ..plain()
    };
    let (got, _) = pull_to(&reference, dir.path(), options).await;
    assert_eq!(
        got.unwrap_or_else(|e| panic!("{e}")).digest.to_string(),
        image.manifest.digest
    );
    assert!(
        !registry
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/token"))
    );
}
