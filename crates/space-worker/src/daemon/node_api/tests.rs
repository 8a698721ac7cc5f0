//! Router tests: `tower::ServiceExt::oneshot` on the real router of a real worker.
