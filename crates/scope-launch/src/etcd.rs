//! A real etcd v3 as the coordinator, for a job across machines.
//!
//! It speaks etcd's JSON gateway (`/v3/...` on the client port) over plain
//! HTTP/1.1, a socket a call, not gRPC. A worker then links no async
//! runtime and no protobuf code, and each call is bounded by one timeout.
//! A lease is an etcd lease; create-if-absent is a transaction comparing
//! the key's create revision with 0; a prefix list is a range.
//!
//! One difference from the embedded store: etcd counts a lease's time to
//! live in whole seconds, at least its minimum (2 s on one default member).
//! A shorter liveness window becomes that, so a job on etcd finds a
//! stopped worker later, never sooner.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

use crate::error::{JobError, Result, resolve};
use crate::store::{Coordinator, Lease};

/// The largest answer read from etcd: a range over a job's keys is far
/// below it, and anything past it is refused rather than held.
const MAX_ANSWER: u64 = 8 << 20;

/// An etcd v3 cluster member, reached at `host:port`.
pub struct Etcd {
    host: String,
    address: SocketAddr,
    patience: Duration,
}

impl Etcd {
    /// The member at `host_port`, each call bounded by `patience`; asks it
    /// once, so a wrong address fails here.
    pub fn connect(host_port: &str, patience: Duration) -> Result<Self> {
        let address = resolve(host_port)?;
        let etcd = Self {
            host: host_port.to_owned(),
            address,
            patience,
        };
        etcd.get("scope-launch/ping")?;
        Ok(etcd)
    }

    fn lost(&self, why: impl std::fmt::Display) -> JobError {
        JobError::lost(self.at(), why)
    }

    /// One gateway call: `body` posted to `path`, the first JSON value of
    /// the answer returned, etcd's own errors typed.
    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.host,
            body.len()
        );
        let mut stream =
            TcpStream::connect_timeout(&self.address, self.patience).map_err(|e| self.lost(e))?;
        stream
            .set_read_timeout(Some(self.patience))
            .and_then(|()| stream.set_write_timeout(Some(self.patience)))
            .map_err(|e| self.lost(e))?;
        stream
            .write_all(request.as_bytes())
            .map_err(|e| self.lost(e))?;
        let mut answer = Vec::new();
        stream
            .take(MAX_ANSWER)
            .read_to_end(&mut answer)
            .map_err(|e| self.lost(e))?;
        // A member that dies mid-answer ends the connection early: an
        // answer cut short is a lost coordinator, not a confused one.
        let cut = |what: &str| self.lost(format!("{path}: the connection ended {what}"));
        if !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            return Err(cut("before the answer's headers"));
        }
        let (status, payload) = http_body(&answer)?;
        let value = serde_json::Deserializer::from_slice(&payload)
            .into_iter::<Value>()
            .next()
            .ok_or_else(|| cut("before the answer's body"))?
            .map_err(|e| {
                if e.is_eof() {
                    cut("mid-answer")
                } else {
                    JobError::Protocol(format!("{path}: {e}"))
                }
            })?;
        if status == 200 {
            return Ok(value);
        }
        let message = value["message"]
            .as_str()
            .or(value["error"].as_str())
            .unwrap_or_default();
        if message.contains("lease not found") {
            return Err(JobError::LeaseExpired);
        }
        Err(JobError::invalid(
            "request",
            format!("etcd answered HTTP {status}: {message}"),
        ))
    }
}

/// The status and body of an HTTP/1.1 answer, its chunks joined.
fn http_body(answer: &[u8]) -> Result<(u16, Vec<u8>)> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| JobError::Protocol("an HTTP answer without its headers' end".into()))?;
    let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
    let status = head
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| JobError::Protocol("an HTTP answer without a status".into()))?;
    let body = &answer[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let (mut joined, mut rest) = (Vec::new(), body);
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| {
                usize::from_str_radix(s.split(';').next().unwrap_or_default().trim(), 16).ok()
            })
            .ok_or_else(|| JobError::Protocol("a chunk without its size".into()))?;
        rest = &rest[end + 2..];
        if size == 0 || rest.len() < size {
            joined.extend_from_slice(&rest[..size.min(rest.len())]);
            break;
        }
        joined.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    Ok((status, joined))
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64, padded: how the gateway carries bytes.
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(text: &str) -> Result<Vec<u8>> {
    let digits: Vec<u32> = text
        .trim_end_matches('=')
        .bytes()
        .map(|c| {
            ALPHABET
                .iter()
                .position(|&a| a == c)
                .map(|p| p as u32)
                .ok_or_else(|| JobError::Protocol(format!("`{}` is not base64", c as char)))
        })
        .collect::<Result<_>>()?;
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &d)| n | d << (18 - 6 * i));
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

/// The first key past every key that starts with `prefix`: etcd's
/// `range_end` for a prefix. Every key, for an empty one.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn number(value: &Value) -> Option<i64> {
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .or(value.as_i64())
}

fn value_of(kv: &Value) -> Result<Vec<u8>> {
    kv["value"].as_str().map_or(Ok(Vec::new()), unbase64)
}

impl Coordinator for Etcd {
    fn at(&self) -> String {
        format!("etcd://{}", self.host)
    }

    fn grant(&self, ttl: Duration) -> Result<Lease> {
        let seconds = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let granted = self.post("/v3/lease/grant", &json!({ "TTL": seconds }))?;
        number(&granted["ID"])
            .map(Lease)
            .ok_or_else(|| JobError::Protocol(format!("a grant without an id: {granted}")))
    }

    fn keep_alive(&self, lease: Lease) -> Result<()> {
        let kept = self.post("/v3/lease/keepalive", &json!({ "ID": lease.0.to_string() }))?;
        match number(&kept["result"]["TTL"]) {
            Some(ttl) if ttl > 0 => Ok(()),
            _ => Err(JobError::LeaseExpired),
        }
    }

    fn revoke(&self, lease: Lease) -> Result<()> {
        match self.post("/v3/lease/revoke", &json!({ "ID": lease.0.to_string() })) {
            Ok(_) | Err(JobError::LeaseExpired) => Ok(()),
            Err(other) => Err(other),
        }
    }

    fn put(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<()> {
        let mut put = json!({ "key": base64(key.as_bytes()), "value": base64(value) });
        if let Some(lease) = lease {
            put["lease"] = json!(lease.0.to_string());
        }
        self.post("/v3/kv/put", &put).map(drop)
    }

    fn create(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<Vec<u8>> {
        let key64 = base64(key.as_bytes());
        let mut put = json!({ "key": key64, "value": base64(value) });
        if let Some(lease) = lease {
            put["lease"] = json!(lease.0.to_string());
        }
        let txn = json!({
            "compare": [{ "key": key64, "result": "EQUAL", "target": "CREATE", "create_revision": "0" }],
            "success": [{ "request_put": put }],
            "failure": [{ "request_range": { "key": key64 } }],
        });
        let done = self.post("/v3/kv/txn", &txn)?;
        if done["succeeded"].as_bool() == Some(true) {
            return Ok(value.to_vec());
        }
        let kv = &done["responses"][0]["response_range"]["kvs"][0];
        if kv.is_null() {
            // Deleted between the compare and the range: try once more.
            return self.create(key, value, lease);
        }
        value_of(kv)
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let got = self.post("/v3/kv/range", &json!({ "key": base64(key.as_bytes()) }))?;
        let kv = &got["kvs"][0];
        if kv.is_null() {
            Ok(None)
        } else {
            value_of(kv).map(Some)
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let start = if prefix.is_empty() {
            vec![0]
        } else {
            prefix.as_bytes().to_vec()
        };
        let range =
            json!({ "key": base64(&start), "range_end": base64(&prefix_end(prefix.as_bytes())) });
        let got = self.post("/v3/kv/range", &range)?;
        let Some(kvs) = got["kvs"].as_array() else {
            return Ok(Vec::new());
        };
        kvs.iter()
            .map(|kv| {
                let key = unbase64(kv["key"].as_str().unwrap_or_default())?;
                let key = String::from_utf8(key)
                    .map_err(|_| JobError::Protocol("a key that is not UTF-8".into()))?;
                Ok((key, value_of(kv)?))
            })
            .collect()
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.post(
            "/v3/kv/deleterange",
            &json!({ "key": base64(key.as_bytes()) }),
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_reads_back_what_it_wrote_and_matches_the_standard() {
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"key"), "a2V5");
        assert_eq!(base64(b"v1"), "djE=");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b""), "");
        for n in 0..40u8 {
            let bytes: Vec<u8> = (0..n).map(|i| i.wrapping_mul(97)).collect();
            assert_eq!(unbase64(&base64(&bytes)).unwrap(), bytes);
        }
        assert!(unbase64("a*b=").is_err());
    }

    #[test]
    fn a_prefix_ends_at_the_next_key_past_it() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), [0]);
    }

    #[test]
    fn chunked_and_plain_answers_read_alike() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(http_body(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(http_body(chunked).unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert!(http_body(b"garbage").is_err());
    }
}
