//! Property tests of the request parsers: whatever the input, they either
//! accept exactly the documented shape or refuse it, and never panic.

use hmdp::auth::Phone;
use hmdp::ids::VoucherId;
use proptest::prelude::*;

proptest! {
    #[test]
    fn path_ids_accept_exactly_positive_decimal_i64(raw in "\\PC{0,24}") {
        let expected = raw.bytes().all(|b| b.is_ascii_digit())
            && raw.parse::<i64>().is_ok_and(|id| id > 0);
        prop_assert_eq!(raw.parse::<VoucherId>().is_ok(), expected);
    }

    #[test]
    fn every_positive_i64_round_trips(id in 1..=i64::MAX) {
        prop_assert_eq!(id.to_string().parse::<VoucherId>().unwrap(), VoucherId::new(id));
    }

    #[test]
    fn phones_are_eleven_ascii_digits_starting_with_1(raw in "\\PC{0,16}") {
        if let Ok(phone) = Phone::parse(&raw) {
            prop_assert_eq!(phone.as_str().len(), 11);
            prop_assert!(phone.as_str().starts_with('1'));
            prop_assert!(phone.as_str().bytes().all(|b| b.is_ascii_digit()));
        }
    }

    #[test]
    fn valid_looking_phones_follow_the_prefix_table(rest in "[0-9]{8}", prefix in "1[0-9]{2}") {
        let raw = format!("{prefix}{rest}");
        let allowed = ["13", "18"].iter().any(|p| prefix.starts_with(p))
            || ["145", "147", "149", "166", "170", "171", "173", "175", "176", "177", "178", "198", "199"]
                .contains(&prefix.as_str())
            || (prefix.starts_with("15") && prefix != "154");
        prop_assert_eq!(Phone::parse(&raw).is_ok(), allowed, "{}", raw);
    }
}
