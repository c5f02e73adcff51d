//! The embedded coordinator's wire: one request a line, one answer a line.
//!
//! Text over TCP, not a framework: both ends are this crate, and the
//! vocabulary is the [`Coordinator`](crate::Coordinator)'s. Keys and values
//! cross as `x` and their bytes in hex, so no byte breaks a line and an
//! empty value is still a token. A line is capped at [`MAX_LINE`]; a peer
//! that sends more is refused and dropped, so bad input never grows memory.

use std::time::Duration;

use crate::error::{JobError, Result};

/// The longest line either end reads, newline included.
pub const MAX_LINE: usize = 1 << 20;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A lease that lives `ttl` unless kept alive.
    Grant(Duration),
    /// Keeps a lease alive for another of its `ttl`.
    Keep(i64),
    /// Ends a lease and its keys now.
    Revoke(i64),
    /// Writes a key, bound to a lease or not.
    Put(Vec<u8>, Vec<u8>, Option<i64>),
    /// Writes a key unless it exists; answers what it holds after.
    Create(Vec<u8>, Vec<u8>, Option<i64>),
    /// Reads a key.
    Get(Vec<u8>),
    /// Every key under a prefix, in key order.
    List(Vec<u8>),
    /// Removes a key.
    Delete(Vec<u8>),
}

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Done, nothing to say.
    Done,
    /// A lease's id.
    Lease(i64),
    /// A key's value, or none.
    Value(Option<Vec<u8>>),
    /// Keys and values.
    Entries(Vec<(Vec<u8>, Vec<u8>)>),
    /// The lease named is gone.
    Expired,
    /// The request was wrong; why.
    Refused(String),
}

/// `x` and the bytes in hex.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(1 + 2 * bytes.len());
    s.push('x');
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn unhex(token: &str) -> Result<Vec<u8>> {
    let digits = token
        .strip_prefix('x')
        .ok_or_else(|| JobError::Protocol(format!("`{}` is not x-hex", head(token))))?;
    if !digits.len().is_multiple_of(2) {
        return Err(JobError::Protocol("odd hex".into()));
    }
    (0..digits.len() / 2)
        .map(|i| {
            u8::from_str_radix(&digits[2 * i..2 * i + 2], 16)
                .map_err(|_| JobError::Protocol(format!("`{}` is not hex", head(token))))
        })
        .collect()
}

fn head(token: &str) -> &str {
    let end = token.char_indices().nth(32).map_or(token.len(), |(i, _)| i);
    &token[..end]
}

fn number<T: std::str::FromStr>(token: Option<&str>, what: &str) -> Result<T> {
    token
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| JobError::Protocol(format!("{what}: not a number")))
}

fn lease_token(lease: Option<i64>) -> String {
    lease.map_or_else(|| "-".to_owned(), |l| l.to_string())
}

fn lease_of(token: Option<&str>) -> Result<Option<i64>> {
    match token {
        Some("-") => Ok(None),
        other => number(other, "lease").map(Some),
    }
}

impl Request {
    /// The line, newline included.
    pub fn encode(&self) -> String {
        let body = match self {
            Self::Grant(ttl) => format!("GRANT {}", ttl.as_millis()),
            Self::Keep(lease) => format!("KEEP {lease}"),
            Self::Revoke(lease) => format!("REVOKE {lease}"),
            Self::Put(k, v, l) => format!("PUT {} {} {}", hex(k), hex(v), lease_token(*l)),
            Self::Create(k, v, l) => format!("CREATE {} {} {}", hex(k), hex(v), lease_token(*l)),
            Self::Get(k) => format!("GET {}", hex(k)),
            Self::List(p) => format!("LIST {}", hex(p)),
            Self::Delete(k) => format!("DEL {}", hex(k)),
        };
        body + "\n"
    }

    /// Reads a line.
    pub fn decode(line: &str) -> Result<Self> {
        let mut t = line.split_ascii_whitespace();
        let verb = t.next().unwrap_or_default();
        let mut bytes = || unhex(t.next().unwrap_or_default());
        let request = match verb {
            "GRANT" => Self::Grant(Duration::from_millis(number(t.next(), "ttl")?)),
            "KEEP" => Self::Keep(number(t.next(), "lease")?),
            "REVOKE" => Self::Revoke(number(t.next(), "lease")?),
            "PUT" | "CREATE" => {
                let (k, v) = (bytes()?, bytes()?);
                let l = lease_of(t.next())?;
                if verb == "PUT" {
                    Self::Put(k, v, l)
                } else {
                    Self::Create(k, v, l)
                }
            }
            "GET" => Self::Get(bytes()?),
            "LIST" => Self::List(bytes()?),
            "DEL" => Self::Delete(bytes()?),
            other => return Err(JobError::Protocol(format!("no verb `{}`", head(other)))),
        };
        match t.next() {
            None => Ok(request),
            Some(extra) => Err(JobError::Protocol(format!(
                "`{}` after the request",
                head(extra)
            ))),
        }
    }
}

impl Answer {
    /// The line, newline included.
    pub fn encode(&self) -> String {
        let body = match self {
            Self::Done => "OK".to_owned(),
            Self::Lease(id) => format!("LEASE {id}"),
            Self::Value(None) => "NONE".to_owned(),
            Self::Value(Some(v)) => format!("VALUE {}", hex(v)),
            Self::Entries(entries) => entries.iter().fold("ENTRIES".to_owned(), |s, (k, v)| {
                s + " " + &hex(k) + " " + &hex(v)
            }),
            Self::Expired => "EXPIRED".to_owned(),
            // One line: a reason's own line breaks become spaces.
            Self::Refused(why) => format!("REFUSED {}", why.replace(['\n', '\r'], " ")),
        };
        body + "\n"
    }

    /// Reads a line.
    pub fn decode(line: &str) -> Result<Self> {
        let line = line.trim_end_matches(['\n', '\r']);
        let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
        Ok(match verb {
            "OK" => Self::Done,
            "LEASE" => Self::Lease(number(Some(rest), "lease")?),
            "NONE" => Self::Value(None),
            "VALUE" => Self::Value(Some(unhex(rest)?)),
            "ENTRIES" => {
                let tokens: Vec<&str> = rest.split_ascii_whitespace().collect();
                if !tokens.len().is_multiple_of(2) {
                    return Err(JobError::Protocol("a key without its value".into()));
                }
                let entries = tokens
                    .chunks(2)
                    .map(|kv| Ok((unhex(kv[0])?, unhex(kv[1])?)))
                    .collect::<Result<_>>()?;
                Self::Entries(entries)
            }
            "EXPIRED" => Self::Expired,
            "REFUSED" => Self::Refused(rest.to_owned()),
            other => return Err(JobError::Protocol(format!("no answer `{}`", head(other)))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_and_answer_reads_back_as_written() {
        let requests = [
            Request::Grant(Duration::from_millis(1500)),
            Request::Keep(7),
            Request::Revoke(-1),
            Request::Put(b"a key".to_vec(), vec![], Some(3)),
            Request::Create(b"k\n".to_vec(), vec![0, 255], None),
            Request::Get(vec![]),
            Request::List(b"alive/".to_vec()),
            Request::Delete(b"x".to_vec()),
        ];
        for r in requests {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        let answers = [
            Answer::Done,
            Answer::Lease(9),
            Answer::Value(None),
            Answer::Value(Some(vec![])),
            Answer::Entries(vec![(b"a".to_vec(), b"1".to_vec()), (vec![], vec![])]),
            Answer::Entries(vec![]),
            Answer::Expired,
            Answer::Refused("no such lease".into()),
        ];
        for a in answers {
            assert_eq!(Answer::decode(&a.encode()).unwrap(), a);
        }
    }

    #[test]
    fn a_line_that_does_not_parse_is_refused_by_name() {
        for bad in [
            "",
            "FLY x00",
            "PUT 00 x00 -",
            "PUT x0 x00 -",
            "PUT xzz x00 -",
            "GRANT soon",
            "GET x00 x00",
            "CREATE x00 x00 never",
        ] {
            assert!(
                matches!(Request::decode(bad), Err(JobError::Protocol(_))),
                "{bad:?}"
            );
        }
        assert!(Answer::decode("ENTRIES x00").is_err());
        assert!(Answer::decode("MAYBE").is_err());
    }
}
