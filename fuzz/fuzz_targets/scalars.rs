//! The small values clients write: quantities (`resources.requests`), Go durations
//! (`timeoutSeconds`-style strings in configs), CIDRs (flags and Service CIDRs) and escaped
//! selector values. No panic; a parsed quantity prints to text that parses to the same value,
//! and that text prints unchanged. (The first print need not be a fixed point: as upstream,
//! `62.5Ki` prints `64000` in the binary format, which parses as decimal and prints `64k`.)
#![no_main]

use flotilla_api_machinery::cidr::Cidr;
use flotilla_api_machinery::quantity::Quantity;
use flotilla_api_machinery::{goduration, selector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(quantity) = Quantity::parse(text) {
        let printed = quantity.to_string();
        let reparsed = Quantity::parse(&printed)
            .unwrap_or_else(|err| panic!("{text:?} printed as {printed:?}, which fails: {err}"));
        assert_eq!(reparsed, quantity, "{text:?} printed as {printed:?}");
        let reprinted = reparsed.to_string();
        let settled = Quantity::parse(&reprinted).map(|again| again.to_string());
        assert_eq!(settled.as_deref(), Ok(reprinted.as_str()), "{text:?}");
    }
    let _ = goduration::parse(text);
    let _ = text.parse::<Cidr>();
    let _ = selector::unescape_value(text);
});
