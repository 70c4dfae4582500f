//! Keys a lock keeps beside its own (release channel, fencing counter, take
//! markers, release latches), placed where Redis Cluster lets one script
//! touch them together.

/// A key (or channel) that must live in the same Redis Cluster slot as `key`,
/// so one script may touch both: when `key` already has a hash tag the suffix
/// keeps it, otherwise the whole key becomes the tag (`{lock:order:7}:fence`
/// hashes exactly like `lock:order:7`). A key with a stray `}` cannot be
/// wrapped in a tag; it gets a plain suffix (same slot only outside Cluster).
///
/// ```
/// assert_eq!(hmdp_lock::sibling("lock:order:7", "fence"), "{lock:order:7}:fence");
/// assert_eq!(hmdp_lock::sibling("lock:{u7}", "fence"), "lock:{u7}:fence");
/// ```
pub fn sibling(key: &str, suffix: &str) -> String {
    sibling_of(key, &[suffix])
}

/// [`sibling`] with a suffix in parts, joined without a `format!` (which
/// costs more than the rest of building a release's keys).
pub(crate) fn sibling_of(key: &str, suffix: &[&str]) -> String {
    let tagged = key
        .find('{')
        .and_then(|open| key[open + 1..].find('}').map(|len| len > 0))
        .unwrap_or(false);
    let length = key.len() + 3 + suffix.iter().map(|part| part.len()).sum::<usize>();
    let mut sibling = String::with_capacity(length);
    if tagged || key.contains('}') {
        sibling.push_str(key);
    } else {
        sibling.push('{');
        sibling.push_str(key);
        sibling.push('}');
    }
    sibling.push(':');
    for part in suffix {
        sibling.push_str(part);
    }
    sibling
}

#[cfg(test)]
mod tests {
    use crate::keys::sibling;

    #[test]
    fn sibling_shares_the_hash_slot() {
        assert_eq!(sibling("lock:order:7", "fence"), "{lock:order:7}:fence");
        assert_eq!(sibling("lock:{u7}", "fence"), "lock:{u7}:fence");
    }
}
