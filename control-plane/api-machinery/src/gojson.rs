//! JSON bytes as Go's `encoding/json` `Encoder` writes them, which is how the API server's
//! responses look: `<`, `>`, `&`, U+2028 and U+2029 escaped as `\u003c` … (Go escapes HTML by
//! default), backspace and form feed as `\u0008` and `\u000c`, and a newline after the value.
//! Key order is the value's own (objects are built in Go struct order where it matters).

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter};

/// A serde_json formatter escaping control characters as Go does (`\u0008`, not `\b`); the
/// characters Go escapes and serde_json never does are rewritten after (see [`to_vec`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: CharEscape,
    ) -> io::Result<()> {
        let text: &[u8] = match char_escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            CharEscape::Solidus => b"\\/",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::Backspace => b"\\u0008",
            CharEscape::FormFeed => b"\\u000c",
            CharEscape::AsciiControl(byte) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let escaped = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(byte >> 4)],
                    HEX[usize::from(byte & 0xF)],
                ];
                return writer.write_all(&escaped);
            }
        };
        writer.write_all(text)
    }
}

/// `value` as Go's `json.Encoder.Encode` writes it, newline included.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value.serialize(&mut serializer)?;
    // `<`, `>`, `&` and the bytes of U+2028/U+2029 can only stand inside strings in JSON, so
    // one fast scan of the output finds every one Go would have escaped; most bodies have
    // none and are left as they are.
    let needs_escaping = memchr::memchr3(b'<', b'>', b'&', &out).is_some()
        || memchr::memmem::find(&out, "\u{2028}".as_bytes()).is_some()
        || memchr::memmem::find(&out, "\u{2029}".as_bytes()).is_some();
    if needs_escaping {
        out = escape_html(&out);
    }
    out.push(b'\n');
    Ok(out)
}

/// `json` with Go's HTML-safe escapes, copied in runs between the characters escaped.
fn escape_html(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + json.len() / 16);
    let mut start = 0;
    for at in memchr::memchr3_iter(b'<', b'>', b'&', json) {
        out.extend_from_slice(&json[start..at]);
        out.extend_from_slice(match json[at] {
            b'<' => b"\\u003c",
            b'>' => b"\\u003e",
            _ => b"\\u0026",
        });
        start = at + 1;
    }
    out.extend_from_slice(&json[start..]);
    for (separator, escaped) in [("\u{2028}", "\\u2028"), ("\u{2029}", "\\u2029")] {
        if memchr::memmem::find(&out, separator.as_bytes()).is_some() {
            out = String::from_utf8_lossy(&out)
                .replace(separator, escaped)
                .into_bytes();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_escaped_as_go_escapes_them() {
        let value = json!({"m": "a<b>&c\u{2028}\u{8}\u{c}\u{1}\"\\\n\té"});
        let text = String::from_utf8(to_vec(&value).expect("json")).expect("utf-8");
        assert_eq!(
            text,
            "{\"m\":\"a\\u003cb\\u003e\\u0026c\\u2028\\u0008\\u000c\\u0001\\\"\\\\\\n\\té\"}\n"
        );
    }
}
