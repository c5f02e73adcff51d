//! `cargo xtask`: placeholder until the hardware-matrix issue lands.
fn main() -> anyhow::Result<()> {
    Ok(())
}
