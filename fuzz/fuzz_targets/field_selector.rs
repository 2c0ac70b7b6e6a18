//! Field selectors as a `fieldSelector` query parameter carries them (upstream's
//! `fields.ParseSelector`, with its escaping): no panic, and a parsed selector prints to text
//! that parses back to the same terms. (Not to the same text: upstream sorts the terms as
//! written, before parsing, so `=);,==` prints `=);,=` and that prints `=,=);`.)
#![no_main]

use flotilla_api_machinery::selector::FieldSelector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(selector) = FieldSelector::parse(text) {
        let printed = selector.to_string();
        let reparsed = FieldSelector::parse(&printed)
            .unwrap_or_else(|err| panic!("{text:?} printed as {printed:?}, which fails: {err}"));
        let terms = |printed: &str| {
            let mut terms: Vec<String> = printed.split(',').map(str::to_string).collect();
            terms.sort();
            terms
        };
        assert_eq!(terms(&reparsed.to_string()), terms(&printed), "{text:?}");
    }
});
