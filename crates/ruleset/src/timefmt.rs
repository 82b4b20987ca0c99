//! The values of `meta time`, `meta day` and `meta hour` as nft writes
//! them: `"2019-06-06 17:00:00"` (ns since the epoch), `"Monday"` (0 is
//! Sunday), `"17:00"` (seconds since midnight). All in UTC: the kernel
//! compares UTC, and nft converts the local time of the machine it runs on,
//! which is the same thing on a machine whose time zone is UTC.
//!
//! The calendar arithmetic is Howard Hinnant's `days_from_civil` and
//! `civil_from_days` (proleptic Gregorian calendar), written out here rather
//! than pulling in a date crate for two functions.

/// Seconds in a day.
pub const DAY_SECS: u64 = 86_400;

/// Day names, Sunday first (the kernel's numbering: day 0 is Sunday).
pub const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number (days since 1970-01-01).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

fn num<T: std::str::FromStr>(s: &str, digits: std::ops::RangeInclusive<usize>) -> Option<T> {
    (digits.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `HH:MM` or `HH:MM:SS` as seconds since midnight.
pub fn parse_hour(s: &str) -> Option<u64> {
    let mut it = s.split(':');
    let h: u64 = num(it.next()?, 1..=2)?;
    let m: u64 = num(it.next()?, 1..=2)?;
    let sec: u64 = match it.next() {
        Some(x) => num(x, 1..=2)?,
        None => 0,
    };
    if it.next().is_some() || h > 23 || m > 59 || sec > 59 {
        return None;
    }
    Some(h * 3600 + m * 60 + sec)
}

/// Seconds since midnight as nft prints them: `HH:MM`, with `:SS` when
/// the seconds are not zero.
pub fn format_hour(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if s == 0 {
        format!("{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// `YYYY-MM-DD`, `YYYY-MM-DD HH:MM` or `YYYY-MM-DD HH:MM:SS` (a `T` may
/// separate date and time, as iptables writes it) as seconds since the
/// epoch; nothing before 1970.
pub fn parse_date_time(s: &str) -> Option<u64> {
    let (date, time) = match s.split_once([' ', 'T']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let mut it = date.split('-');
    let y: i64 = num(it.next()?, 4..=4)?;
    let m: u32 = num(it.next()?, 1..=2)?;
    let d: u32 = num(it.next()?, 1..=2)?;
    if it.next().is_some() || !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    let day = u64::try_from(days_from_civil(y, m, d)).ok()?;
    let t = match time {
        Some(t) => parse_hour(t)?,
        None => 0,
    };
    day.checked_mul(DAY_SECS)?.checked_add(t)
}

/// `YYYY-MM-DD`, `sep`, `HH:MM:SS` of seconds since the epoch.
fn date_time(secs: u64, sep: char) -> String {
    let (y, m, d) = civil_from_days((secs / DAY_SECS) as i64);
    let t = secs % DAY_SECS;
    format!(
        "{y:04}-{m:02}-{d:02}{sep}{:02}:{:02}:{:02}",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// Seconds since the epoch as nft prints a time: `YYYY-MM-DD HH:MM:SS`.
pub fn format_date_time(secs: u64) -> String {
    date_time(secs, ' ')
}

/// Milliseconds since the epoch as an RFC 3339 UTC timestamp:
/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn format_rfc3339_ms(ms: u64) -> String {
    format!("{}.{:03}Z", date_time(ms / 1000, 'T'), ms % 1000)
}

/// The day of the week (0 Sunday) of a time in seconds since the epoch:
/// 1970-01-01 was a Thursday.
pub fn weekday(secs: u64) -> u64 {
    (secs / DAY_SECS + 4) % 7
}

/// A day name, whole and in any case (`monday`, `Monday`), as a number.
pub fn parse_day(s: &str) -> Option<u64> {
    DAYS.iter()
        .position(|d| d.eq_ignore_ascii_case(s))
        .map(|i| i as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_milliseconds() {
        assert_eq!(super::format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        // 2026-11-24 12:34:56.789 UTC.
        let ms = (super::days_from_civil(2026, 11, 24) as u64 * super::DAY_SECS
            + 12 * 3600
            + 34 * 60
            + 56)
            * 1000
            + 789;
        assert_eq!(super::format_rfc3339_ms(ms), "2026-11-24T12:34:56.789Z");
        assert_eq!(
            super::format_rfc3339_ms(951_782_400_000 - 1),
            "2000-02-28T23:59:59.999Z"
        );
    }
    use super::*;

    #[test]
    fn dates_round_trip_and_match_known_epochs() {
        assert_eq!(parse_date_time("1970-01-01"), Some(0));
        assert_eq!(parse_date_time("2023-11-14 22:13:20"), Some(1_700_000_000));
        assert_eq!(parse_date_time("2000-02-29T12:00"), Some(951_825_600));
        assert_eq!(parse_date_time("2038-01-19 03:14:07"), Some(2_147_483_647));
        for bad in [
            "2001-02-29",
            "2020-13-01",
            "2020-1-32",
            "1969-12-31",
            "20-01-01",
            "2020-01-01 24:00",
            "2020-01-01 12:60",
            "2020-01-01 12:00:00:00",
            "",
        ] {
            assert_eq!(parse_date_time(bad), None, "{bad}");
        }
        for s in [0u64, 59, 86_399, 951_825_600, 1_700_000_000, 4_102_444_800] {
            assert_eq!(parse_date_time(&format_date_time(s)), Some(s));
        }
        assert_eq!(format_date_time(1_700_000_000), "2023-11-14 22:13:20");
    }

    #[test]
    fn hours_and_days() {
        assert_eq!(parse_hour("17:00"), Some(61_200));
        assert_eq!(parse_hour("8:30:15"), Some(30_615));
        assert_eq!(parse_hour("24:00"), None);
        assert_eq!(parse_hour("12"), None);
        assert_eq!(format_hour(61_200), "17:00");
        assert_eq!(format_hour(30_615), "08:30:15");
        assert_eq!(parse_day("monday"), Some(1));
        assert_eq!(parse_day("Sunday"), Some(0));
        assert_eq!(parse_day("Mon"), None);
        // 2023-11-14 was a Tuesday.
        assert_eq!(weekday(1_700_000_000), 2);
        assert_eq!(weekday(0), 4);
    }
}
