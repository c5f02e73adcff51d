//! The launcher's coordinator, served to its workers over loopback TCP.
//!
//! On one machine nothing needs installing: the launcher keeps the
//! [`Store`] and serves it here, a thread a connection. When the launcher
//! dies, so does this, and every worker's next heartbeat fails at once
//! (`ECONNREFUSED`/`EOF`, not a timeout), which is how workers learn the job
//! is over. Connections are capped at [`MAX_CONNECTIONS`] and lines at
//! [`MAX_LINE`], so a confused client cannot grow the launcher without end.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::error::{JobError, Result};
use crate::store::{Coordinator, Lease, Store};
use crate::wire::{Answer, MAX_LINE, Request};

/// The most clients served at once.
pub const MAX_CONNECTIONS: usize = 1024;

/// The connections being served, by number: each serving thread removes
/// its own when its client hangs up, and a drop ends the rest.
type Open = Arc<Mutex<HashMap<u64, TcpStream>>>;

/// A [`Store`] served on a loopback port until dropped.
pub struct Embedded {
    address: SocketAddr,
    store: Arc<Store>,
    stopping: Arc<AtomicBool>,
    open: Open,
    acceptor: Option<JoinHandle<()>>,
}

impl Embedded {
    /// Serves `store` on a free port of 127.0.0.1.
    pub fn start(store: Arc<Store>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| JobError::Process(format!("binding the coordinator: {e}")))?;
        let address = listener
            .local_addr()
            .map_err(|e| JobError::Process(format!("the coordinator's port: {e}")))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let open = Open::default();
        let acceptor = {
            let (store, stopping, open) = (store.clone(), stopping.clone(), open.clone());
            std::thread::Builder::new()
                .name("scope-coordinator".into())
                .spawn(move || accept(&listener, &store, &stopping, &open))
                .map_err(|e| JobError::Process(format!("the coordinator's thread: {e}")))?
        };
        Ok(Self {
            address,
            store,
            stopping,
            open,
            acceptor: Some(acceptor),
        })
    }

    /// The address a worker connects to: `tcp://127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("tcp://{}", self.address)
    }

    /// The store served.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the acceptor with one last connection, then end every open
        // one, so a worker learns at once that its coordinator is gone.
        let _ = TcpStream::connect(self.address);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for (_, stream) in self.open.lock().drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept(listener: &TcpListener, store: &Arc<Store>, stopping: &AtomicBool, open: &Open) {
    for (number, stream) in (0u64..).zip(listener.incoming()) {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let Ok(kept) = stream.try_clone() else {
            continue;
        };
        {
            let mut open = open.lock();
            if open.len() >= MAX_CONNECTIONS {
                let refused = Answer::Refused(format!("{MAX_CONNECTIONS} clients already"));
                let _ = stream.write_all(refused.encode().as_bytes());
                continue;
            }
            open.insert(number, kept);
        }
        let (store, served) = (store.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("scope-coordinator-client".into())
            .spawn(move || {
                serve(stream, &store);
                served.lock().remove(&number);
            });
        if spawned.is_err() {
            open.lock().remove(&number);
            tracing::warn!("the coordinator could not start a thread for a client");
        }
    }
}

/// Answers one client's lines until it hangs up or sends what cannot be a
/// line.
fn serve(stream: TcpStream, store: &Store) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        let read = (&mut reader).take(MAX_LINE as u64).read_line(&mut line);
        let answer = match read {
            Ok(0) | Err(_) => return,
            Ok(_) if !line.ends_with('\n') => {
                let _ = writer.write_all(
                    Answer::Refused(format!("a line past {MAX_LINE} bytes"))
                        .encode()
                        .as_bytes(),
                );
                return;
            }
            Ok(_) => match Request::decode(&line) {
                Ok(request) => answer(store, request),
                Err(JobError::Protocol(why)) => Answer::Refused(why),
                Err(e) => Answer::Refused(e.to_string()),
            },
        };
        if writer.write_all(answer.encode().as_bytes()).is_err() {
            return;
        }
    }
}

fn text(bytes: Vec<u8>) -> std::result::Result<String, Answer> {
    String::from_utf8(bytes).map_err(|_| Answer::Refused("a key that is not UTF-8".into()))
}

/// One request against the store, as the trait answers it in process.
pub(crate) fn answer(store: &Store, request: Request) -> Answer {
    let run = || -> std::result::Result<Answer, Answer> {
        let lease = |l: Option<i64>| l.map(Lease);
        let done = match request {
            Request::Grant(ttl) => store.grant(ttl).map(|l| Answer::Lease(l.0)),
            Request::Keep(l) => store.keep_alive(Lease(l)).map(|()| Answer::Done),
            Request::Revoke(l) => store.revoke(Lease(l)).map(|()| Answer::Done),
            Request::Put(k, v, l) => store.put(&text(k)?, &v, lease(l)).map(|()| Answer::Done),
            Request::Create(k, v, l) => store
                .create(&text(k)?, &v, lease(l))
                .map(|held| Answer::Value(Some(held))),
            Request::Get(k) => store.get(&text(k)?).map(Answer::Value),
            Request::List(p) => store.list(&text(p)?).map(|entries| {
                Answer::Entries(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.into_bytes(), v))
                        .collect(),
                )
            }),
            Request::Delete(k) => store.delete(&text(k)?).map(|()| Answer::Done),
        };
        Ok(match done {
            Ok(answer) => answer,
            Err(JobError::LeaseExpired) => Answer::Expired,
            Err(other) => Answer::Refused(other.to_string()),
        })
    };
    run().unwrap_or_else(|refused| refused)
}
