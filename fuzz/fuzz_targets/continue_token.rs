//! Continue tokens as clients send them back (`?continue=`): no panic; a token that decodes
//! has a start key that cannot climb out of the list's prefix, and encodes back to a token
//! that decodes to the same.
#![no_main]

use flotilla_api_machinery::continue_token::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(token) = decode(text) {
        assert!(
            !token.start.starts_with('/') && !token.start.split('/').any(|s| s == ".."),
            "{text:?} decoded to {token:?}"
        );
        assert_eq!(decode(&encode(token.rv, &token.start)), Ok(token));
    }
});
