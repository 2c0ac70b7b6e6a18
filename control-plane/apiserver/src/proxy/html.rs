//! Links inside proxied HTML moved under the proxy's path (upstream's proxy `Transport`
//! `rewriteHTML`, sans IO): the URL-valued attributes of start tags are passed through a
//! rewriter; every other byte — text, comments, declarations, end tags, the raw text of
//! scripts and styles — is copied as it came.

/// The attributes of each tag whose values are URLs (upstream's `atomsToAttrs`).
const URL_ATTRIBUTES: &[(&str, &[&str])] = &[
    ("a", &["href"]),
    ("applet", &["codebase"]),
    ("area", &["href"]),
    ("audio", &["src"]),
    ("base", &["href"]),
    ("blockquote", &["cite"]),
    ("body", &["background"]),
    ("button", &["formaction"]),
    ("command", &["icon"]),
    ("del", &["cite"]),
    ("embed", &["src"]),
    ("form", &["action"]),
    ("frame", &["longdesc", "src"]),
    ("head", &["profile"]),
    ("html", &["manifest"]),
    ("iframe", &["longdesc", "src"]),
    ("img", &["longdesc", "src", "usemap"]),
    ("input", &["src", "usemap", "formaction"]),
    ("ins", &["cite"]),
    ("link", &["href"]),
    ("object", &["classid", "codebase", "data", "usemap"]),
    ("q", &["cite"]),
    ("script", &["src"]),
    ("source", &["src"]),
    ("video", &["poster", "src"]),
];

/// Elements whose content is text up to their end tag, never markup (HTML's raw text and
/// escapable raw text elements): a `<a href>` inside a script is a string, not a link.
const RAW_TEXT: [&str; 8] = [
    "script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes",
];

fn url_attributes(tag: &str) -> &'static [&'static str] {
    URL_ATTRIBUTES
        .iter()
        .find(|(name, _)| *name == tag)
        .map_or(&[], |(_, attributes)| attributes)
}

/// `html` with the URL-valued attributes of its start tags passed through `rewrite`.
pub fn rewrite_html(html: &str, rewrite: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(html.len() + html.len() / 8);
    let mut at = 0;
    while let Some(found) = html[at..].find('<') {
        out.push_str(&html[at..at + found]);
        at += found;
        let rest = &html[at..];
        let copied = if rest.starts_with("<!--") {
            rest.find("-->").map_or(rest.len(), |end| end + 3)
        } else if rest.starts_with("<!") || rest.starts_with("<?") || rest.starts_with("</") {
            rest.find('>').map_or(rest.len(), |end| end + 1)
        } else {
            0
        };
        if copied > 0 {
            out.push_str(&rest[..copied]);
            at += copied;
            continue;
        }
        let name_end = rest[1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .map_or(rest.len(), |end| end + 1);
        if name_end == 1 || !rest.as_bytes()[1].is_ascii_alphabetic() {
            // A lone `<` in text.
            out.push('<');
            at += 1;
            continue;
        }
        let tag = rest[1..name_end].to_ascii_lowercase();
        let consumed = start_tag(rest, name_end, url_attributes(&tag), &rewrite, &mut out);
        at += consumed;
        if RAW_TEXT.contains(&tag.as_str()) {
            let end = find_end_tag(&html[at..], &tag).unwrap_or(html.len() - at);
            out.push_str(&html[at..at + end]);
            at += end;
        }
    }
    out.push_str(&html[at..]);
    out
}

/// Copies the start tag at the beginning of `tag` (its name ending at `name_end`) into `out`,
/// the values of `urls` rewritten; answers how many bytes it took.
fn start_tag(
    tag: &str,
    name_end: usize,
    urls: &[&str],
    rewrite: &impl Fn(&str) -> String,
    out: &mut String,
) -> usize {
    let bytes = tag.as_bytes();
    let mut at = name_end;
    let mut copied = 0;
    let skip_space = |mut at: usize| {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    loop {
        at = skip_space(at);
        match bytes.get(at) {
            None => break,
            Some(b'>') => {
                at += 1;
                break;
            }
            Some(b'/') => {
                at += 1;
                continue;
            }
            Some(_) => {}
        }
        let name_start = at;
        while at < bytes.len() && !bytes[at].is_ascii_whitespace() && !b"=>/".contains(&bytes[at]) {
            at += 1;
        }
        let name = tag[name_start..at].to_ascii_lowercase();
        let after_name = skip_space(at);
        if bytes.get(after_name) != Some(&b'=') {
            continue;
        }
        at = skip_space(after_name + 1);
        let (value_start, value_end) = match bytes.get(at) {
            Some(quote @ (b'"' | b'\'')) => {
                let start = at + 1;
                let end = tag[start..]
                    .find(char::from(*quote))
                    .map_or(tag.len(), |end| start + end);
                at = (end + 1).min(tag.len());
                (start, end)
            }
            _ => {
                let start = at;
                while at < bytes.len() && !bytes[at].is_ascii_whitespace() && bytes[at] != b'>' {
                    at += 1;
                }
                (start, at)
            }
        };
        if urls.contains(&name.as_str()) {
            out.push_str(&tag[copied..value_start]);
            out.push_str(&rewrite(&tag[value_start..value_end]));
            copied = value_end;
        }
    }
    out.push_str(&tag[copied..at]);
    at
}

/// Where `</tag` (any case) starts in `text`.
fn find_end_tag(text: &str, tag: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(found) = text[from..].find("</") {
        let at = from + found;
        let name = at + 2;
        let named = bytes
            .get(name..name + tag.len())
            .is_some_and(|candidate| candidate.eq_ignore_ascii_case(tag.as_bytes()));
        // `</scripts` is not the end of a script.
        let whole = !bytes
            .get(name + tag.len())
            .is_some_and(u8::is_ascii_alphanumeric);
        if named && whole {
            return Some(at);
        }
        from = name;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved(url: &str) -> String {
        if url.starts_with('/') {
            format!("/p{url}")
        } else {
            url.to_string()
        }
    }

    #[test]
    fn url_attributes_move_and_everything_else_stays() {
        let html = concat!(
            "<!DOCTYPE html><html><head><title>a <a href=\"/no\"></title>",
            "<link rel=stylesheet href=/style.css>",
            "<script src='/app.js'>var s = '<a href=\"/in-script\">';</script>",
            "</head><body>",
            "<!-- <a href=\"/commented\"> -->",
            "<A HREF = \"/upper\" title=\"/not-a-url\">x</A>",
            "<img alt=\"1 < 2\" src=\"/i.png\"/>",
            "<form action=/submit method=post><input type=image src=\"rel.png\"></form>",
            "<a href=\"https://other.example/x\">o</a> 3 < 4 <br/>",
            "</body></html>",
        );
        let expected = concat!(
            "<!DOCTYPE html><html><head><title>a <a href=\"/no\"></title>",
            "<link rel=stylesheet href=/p/style.css>",
            "<script src='/p/app.js'>var s = '<a href=\"/in-script\">';</script>",
            "</head><body>",
            "<!-- <a href=\"/commented\"> -->",
            "<A HREF = \"/p/upper\" title=\"/not-a-url\">x</A>",
            "<img alt=\"1 < 2\" src=\"/p/i.png\"/>",
            "<form action=/p/submit method=post><input type=image src=\"rel.png\"></form>",
            "<a href=\"https://other.example/x\">o</a> 3 < 4 <br/>",
            "</body></html>",
        );
        assert_eq!(rewrite_html(html, moved), expected);
    }

    #[test]
    fn broken_markup_is_copied_as_it_came() {
        for (html, expected) in [
            ("<a href=\"/unterminated", "<a href=\"/p/unterminated"),
            ("<a href=", "<a href="),
            ("<", "<"),
            ("text <", "text <"),
            ("<a =x href=/y>", "<a =x href=/p/y>"),
            (
                "<script>never closed <a href=/x>",
                "<script>never closed <a href=/x>",
            ),
            ("<!-- never closed", "<!-- never closed"),
            ("<1a href=/x>", "<1a href=/x>"),
            ("<p>ü <a href=/ä>ö</a>", "<p>ü <a href=/p/ä>ö</a>"),
        ] {
            assert_eq!(rewrite_html(html, moved), expected, "{html:?}");
        }
    }
}
