//! A worker's connection to the embedded coordinator.
//!
//! One TCP stream, one request at a time under a lock: the heartbeat thread
//! and the program's own calls share it, and neither waits long, since the
//! store answers at once. Every read and write is bounded by the client's
//! patience, so a launcher that is stopped rather than dead
//! (`SIGSTOP`) still ends a worker's call, as [`JobError::CoordinatorLost`].

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::{JobError, Result, resolve};
use crate::store::{Coordinator, Lease};
use crate::wire::{Answer, MAX_LINE, Request};

/// The embedded coordinator, seen from another process.
pub struct Remote {
    address: SocketAddr,
    patience: Duration,
    stream: Mutex<Option<BufReader<TcpStream>>>,
}

impl Remote {
    /// A client of the coordinator at `host:port`, each call bounded by
    /// `patience`. Connects at once, so a wrong address fails here.
    pub fn connect(host_port: &str, patience: Duration) -> Result<Self> {
        let address = resolve(host_port)?;
        let remote = Self {
            address,
            patience,
            stream: Mutex::new(None),
        };
        *remote.stream.lock() = Some(remote.open()?);
        Ok(remote)
    }

    fn lost(&self, why: impl std::fmt::Display) -> JobError {
        JobError::lost(self.at(), why)
    }

    fn open(&self) -> Result<BufReader<TcpStream>> {
        let stream =
            TcpStream::connect_timeout(&self.address, self.patience).map_err(|e| self.lost(e))?;
        stream
            .set_read_timeout(Some(self.patience))
            .and_then(|()| stream.set_write_timeout(Some(self.patience)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| self.lost(e))?;
        Ok(BufReader::new(stream))
    }

    fn exchange(stream: &mut BufReader<TcpStream>, line: &str) -> std::io::Result<String> {
        stream.get_mut().write_all(line.as_bytes())?;
        let mut answer = String::new();
        stream
            .by_ref()
            .take(MAX_LINE as u64)
            .read_line(&mut answer)?;
        if !answer.ends_with('\n') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection ended mid-answer",
            ));
        }
        Ok(answer)
    }

    /// Sends `request`, once more on a fresh connection if the first one
    /// broke (every request is safe to repeat: a repeated grant makes a
    /// lease that lapses on its own).
    fn call(&self, request: &Request) -> Result<Answer> {
        let line = request.encode();
        let mut stream = self.stream.lock();
        let mut why = None;
        for _ in 0..2 {
            let s = match stream.as_mut() {
                Some(s) => s,
                None => stream.insert(self.open()?),
            };
            match Self::exchange(s, &line) {
                Ok(answer) => return Answer::decode(&answer),
                Err(e) => {
                    *stream = None;
                    why = Some(e);
                }
            }
        }
        Err(self.lost(why.map_or_else(String::new, |e| e.to_string())))
    }

    fn expect_done(&self, request: &Request) -> Result<()> {
        match self.call(request)? {
            Answer::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(answer: Answer) -> JobError {
    match answer {
        Answer::Expired => JobError::LeaseExpired,
        Answer::Refused(why) => JobError::invalid("request", why),
        other => JobError::Protocol(format!("an answer out of place: {other:?}")),
    }
}

fn key_text(key: Vec<u8>) -> Result<String> {
    String::from_utf8(key).map_err(|_| JobError::Protocol("a key that is not UTF-8".into()))
}

impl Coordinator for Remote {
    fn at(&self) -> String {
        format!("tcp://{}", self.address)
    }

    fn grant(&self, ttl: Duration) -> Result<Lease> {
        match self.call(&Request::Grant(ttl))? {
            Answer::Lease(id) => Ok(Lease(id)),
            other => Err(unexpected(other)),
        }
    }

    fn keep_alive(&self, lease: Lease) -> Result<()> {
        self.expect_done(&Request::Keep(lease.0))
    }

    fn revoke(&self, lease: Lease) -> Result<()> {
        self.expect_done(&Request::Revoke(lease.0))
    }

    fn put(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<()> {
        self.expect_done(&Request::Put(key.into(), value.into(), lease.map(|l| l.0)))
    }

    fn create(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<Vec<u8>> {
        match self.call(&Request::Create(
            key.into(),
            value.into(),
            lease.map(|l| l.0),
        ))? {
            Answer::Value(Some(held)) => Ok(held),
            other => Err(unexpected(other)),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self.call(&Request::Get(key.into()))? {
            Answer::Value(value) => Ok(value),
            other => Err(unexpected(other)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        match self.call(&Request::List(prefix.into()))? {
            Answer::Entries(entries) => entries
                .into_iter()
                .map(|(k, v)| Ok((key_text(k)?, v)))
                .collect(),
            other => Err(unexpected(other)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.expect_done(&Request::Delete(key.into()))
    }
}
