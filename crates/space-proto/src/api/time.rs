//! Times as the API writes them: RFC 3339, UTC.

/// Formats Unix seconds as RFC 3339 UTC (`2026-11-30T01:02:03Z`).
pub fn rfc3339(unix_secs: u64) -> String {
    let (date, time) = civil(i64::try_from(unix_secs).unwrap_or(i64::MAX));
    format!("{date}T{time}Z")
}

/// Formats a time of the Unix clock (seconds, before the epoch too, and nanoseconds)
/// as RFC 3339 UTC with nanoseconds (`2026-11-30T01:02:03.000000042Z`).
pub fn rfc3339_nanos(secs: i64, nanos: u32) -> String {
    let (date, time) = civil(secs);
    format!("{date}T{time}.{:09}Z", nanos.min(999_999_999))
}

/// The date (`YYYY-MM-DD`) and time of day (`HH:MM:SS`) of Unix seconds, in UTC.
fn civil(secs: i64) -> (String, String) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm), for days since 1970-01-01; in
    // i128 so that no i64 of seconds overflows.
    let z = i128::from(days) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i128::from(mo <= 2);
    (
        format!("{y:04}-{mo:02}-{d:02}"),
        format!("{h:02}:{m:02}:{s:02}"),
    )
}
