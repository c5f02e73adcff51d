//! From an address to a coordinator: the one place that knows the schemes.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{JobError, Result};
use crate::etcd::Etcd;
use crate::remote::Remote;
use crate::store::Coordinator;

/// The coordinator at `address`: `tcp://HOST:PORT` for a launcher's
/// embedded one, `etcd://HOST:PORT` for a member of an etcd cluster. Each call waits at most `patience` for an answer.
pub fn connect(address: &str, patience: Duration) -> Result<Arc<dyn Coordinator>> {
    match address.split_once("://") {
        Some(("tcp", host_port)) => Ok(Arc::new(Remote::connect(host_port, patience)?)),
        Some(("etcd", host_port)) => Ok(Arc::new(Etcd::connect(host_port, patience)?)),
        _ => Err(JobError::invalid(
            "coordinator address",
            format!("`{address}`: expected tcp://HOST:PORT or etcd://HOST:PORT"),
        )),
    }
}
