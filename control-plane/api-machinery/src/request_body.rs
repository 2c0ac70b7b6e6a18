//! Request bodies read as upstream reads them, with limits a hostile client cannot get past:
//! JSON (serde_json's nesting limit) and YAML (JSON first when it looks like JSON; otherwise
//! its events checked for depth and alias expansion before serde_yaml builds anything), each
//! error in upstream's words. Sans-IO: the API server maps an error to a 400.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

/// A JSON body as a value.
pub fn parse_json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body)
        .map_err(|e| format!("couldn't get version/kind; json parse error: {e}"))
}

/// How deeply a request body may nest objects and lists: serde_json's recursion limit, and
/// the same for YAML (upstream allows 10,000; no Kubernetes object comes near 128).
pub const MAX_BODY_DEPTH: usize = 128;

/// How many nodes aliases may add to a YAML body in all, counting an alias as the whole node
/// it repeats (goyaml's "excessive aliasing" guard, simpler): without it ten lines of nested
/// aliases expand to a billion nodes.
pub const MAX_YAML_ALIAS_NODES: u64 = 100_000;

/// Refuses a YAML body that nests deeper than [`MAX_BODY_DEPTH`] or whose aliases would add
/// more than [`MAX_YAML_ALIAS_NODES`] nodes, reading its events only up to the first one over
/// a limit. libyaml (under serde_yaml) keeps a simple-key slot per open flow collection and
/// visits every slot on every token: `[` × 70,000 cost it minutes. Stopping at the limit
/// bounds that work by the body's length × the limit.
pub fn check_yaml(text: &str, abandoned: &AtomicBool) -> Result<(), String> {
    use yaml_rust2::parser::{Event, Parser};
    let refuse = |why: String| format!("error converting YAML to JSON: yaml: {why}");
    let mut parser = Parser::new_from_str(text);
    // Open collections: (anchor, nodes counted when it opened); nodes counted so far, aliases
    // expanded; each anchor's size in nodes.
    let mut open: Vec<(usize, u64)> = Vec::new();
    let (mut nodes, mut aliased) = (0u64, 0u64);
    let mut anchors: HashMap<usize, u64> = HashMap::new();
    for events in 0u64.. {
        // The client went away: stop reading for nobody (checked now and then, it is cheap).
        if events % 4096 == 0 && abandoned.load(Ordering::Relaxed) {
            return Err("the client went away".to_string());
        }
        let (event, _) = parser.next_token().map_err(|e| refuse(e.to_string()))?;
        match event {
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                open.push((anchor, nodes));
                nodes += 1;
                if open.len() > MAX_BODY_DEPTH {
                    return Err(refuse(format!("exceeded max depth of {MAX_BODY_DEPTH}")));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((anchor, start)) = open.pop()
                    && anchor > 0
                {
                    anchors.insert(anchor, nodes - start);
                }
            }
            Event::Scalar(_, _, anchor, _) => {
                nodes += 1;
                if anchor > 0 {
                    anchors.insert(anchor, 1);
                }
            }
            Event::Alias(anchor) => {
                let size = anchors.get(&anchor).copied().unwrap_or(1);
                nodes += size;
                aliased += size;
                if aliased > MAX_YAML_ALIAS_NODES {
                    return Err(refuse("document contains excessive aliasing".into()));
                }
            }
            Event::StreamEnd => return Ok(()),
            _ => {}
        }
    }
    Ok(())
}

/// Parses a YAML body: JSON first when it looks like JSON (what kubectl sends even as
/// `application/apply-patch+yaml`; linear, and depth-limited by serde_json), otherwise YAML
/// once its depth is checked.
pub fn parse_yaml(body: &[u8], abandoned: &AtomicBool) -> Result<Value, String> {
    let looks_like_json = body
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    if looks_like_json && let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| format!("error converting YAML to JSON: yaml: {e}"))?;
    check_yaml(text, abandoned)?;
    serde_yaml::from_str::<Value>(text)
        .map_err(|e| format!("error converting YAML to JSON: yaml: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `request_body` fuzz target: numbers are read correctly rounded, as Go's
    /// `strconv.ParseFloat` reads them, so what is written back reads back the same.
    #[test]
    fn numbers_read_correctly_rounded_and_write_back_the_same() {
        let never = AtomicBool::new(false);
        let nines = "9".repeat(64);
        for body in [
            nines.as_str(),
            "9.999999999999999e63",
            "0.1",
            "1e-7",
            "123456789.123456789",
        ] {
            let from_yaml = parse_yaml(body.as_bytes(), &never).expect("yaml");
            let from_json = parse_json(body.as_bytes()).expect("json");
            let expected: f64 = body.parse().expect("a float");
            assert_eq!(from_json.as_f64(), Some(expected), "{body} as JSON");
            assert_eq!(from_yaml.as_f64(), Some(expected), "{body} as YAML");
            let written = serde_json::to_vec(&from_json).expect("written");
            assert_eq!(parse_json(&written).ok(), Some(from_json), "{body}");
        }
    }
}
