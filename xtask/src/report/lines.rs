//! The lines a test prints that say what it did: `skipped: <reason>`,
//! `not exercised: <reason> [<test>]`, `not run: <reason>`,
//! `not applicable: <reason>`, read at the start of a line and through the
//! terminal's colour codes.

/// The reason in a skip line: `skipped: <reason>` at the start of a line
/// (after indentation), with a reason. Case-insensitive in `skipped`; a
/// `skipped:` later in a line (a log message, an assertion's text) is not
/// one.
pub fn skip_reason(line: &str) -> Option<String> {
    let line = strip_ansi_ref(line);
    let trimmed = line.trim();
    let head = trimmed.get(..8)?;
    if !head.eq_ignore_ascii_case("skipped:") {
        return None;
    }
    let reason = trimmed[8..].trim();
    (!reason.is_empty()).then(|| reason.to_owned())
}

/// A line that says its test did nothing on the device, at the start of a line
/// → (reason, name). It reads `not exercised: <reason>`, perhaps ending in the
/// test's name in brackets (`not exercised: nothing reached the device [wgpu::plane::sum]`).
pub fn not_exercised(line: &str) -> Option<(String, Option<String>)> {
    let line = strip_ansi_ref(line);
    let rest = after_label(line.trim(), "not exercised:")?;
    if let Some(open) = rest.rfind('[')
        && let Some(name) = rest[open + 1..].strip_suffix(']')
        && !name.is_empty()
    {
        let reason = rest[..open].trim();
        return (!reason.is_empty()).then(|| (reason.to_owned(), Some(name.to_owned())));
    }
    Some((rest.to_owned(), None))
}

/// The reason in a `not run: <reason>` line: a test its binary marks as not
/// holding on this device.
pub fn not_run_reason(line: &str) -> Option<String> {
    let line = strip_ansi_ref(line);
    after_label(line.trim(), "not run:").map(str::to_owned)
}

/// The reason in a `not applicable: <reason>` line: a behaviour its suite
/// cannot have by design, on any machine (the kit's capabilities).
pub fn not_applicable(line: &str) -> Option<String> {
    let line = strip_ansi_ref(line);
    after_label(line.trim(), "not applicable:").map(str::to_owned)
}

/// What follows `label` (any case) at the start of `trimmed`, when there is
/// something.
fn after_label<'a>(trimmed: &'a str, label: &str) -> Option<&'a str> {
    let head = trimmed.get(..label.len())?;
    if !head.eq_ignore_ascii_case(label) {
        return None;
    }
    let rest = trimmed[label.len()..].trim();
    (!rest.is_empty()).then_some(rest)
}

/// `line` without its ANSI colour and style sequences (a runner told to
/// colour its output through `CARGO_TERM_COLOR=always`).
pub fn strip_ansi(line: &str) -> String {
    if !line.contains('\u{1b}') {
        return line.to_owned();
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, up to the final byte.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

pub(super) fn strip_ansi_ref(line: &str) -> std::borrow::Cow<'_, str> {
    if line.contains('\u{1b}') {
        std::borrow::Cow::Owned(strip_ansi(line))
    } else {
        std::borrow::Cow::Borrowed(line)
    }
}

/// The number before `word` in `text` ("12 passed" → 12).
pub fn number_before(text: &str, word: &str) -> Option<u64> {
    let at = text.find(word)?;
    text[..at]
        .split(|c: char| !c.is_ascii_digit())
        .rev()
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}
