//! A real illegal address poisons the device. In a binary of its own: a
//! sticky fault corrupts the process's primary context, which every other
//! client in the same process shares.

mod common;

use common::{cases, client};

#[test]
fn an_illegal_address_poisons_the_device() {
    let Some(c) = client() else { return };
    let fault = cases::an_illegal_address_poisons_the_device(&c);
    println!("the driver said: {fault}");
}
