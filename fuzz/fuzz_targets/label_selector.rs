//! Label selectors as a `labelSelector` query parameter carries them (upstream's
//! `labels.Parse`): no panic, and a parsed selector prints to text that parses back to it.
#![no_main]

use flotilla_api_machinery::selector::LabelSelector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(selector) = LabelSelector::parse(text) {
        let printed = selector.to_string();
        let reparsed = LabelSelector::parse(&printed)
            .unwrap_or_else(|err| panic!("{text:?} printed as {printed:?}, which fails: {err}"));
        assert_eq!(reparsed.to_string(), printed, "{text:?}");
    }
});
