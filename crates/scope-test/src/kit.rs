//! What a suite has, what a behaviour needs, and the test each becomes.
//!
//! Each behaviour module lists its behaviours in its own `*_tests!` macro, each with what it needs
//! beyond a client. A suite says what it has once, in [`Suite::capabilities`]. The test decides as
//! it runs. A suite that lacks a need prints `not applicable: <reason>` and passes. `cargo xtask
//! test` counts it apart from a pass, and apart from a test that could have run here and did not
//! (`not exercised`): no machine changes what a suite is.

use scope_core::collective::Group;

use crate::Suite;

#[doc(hidden)]
pub use scope_core::collective::device::DeviceCollectives;

/// What a behaviour may need beyond a client of the suite's backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// The backend opens a lost device again
    /// ([`Backend::reopen`](scope_core::backend::Backend::reopen)).
    Reopen,
    /// [`Suite::group`] makes its groups over a device transport.
    DeviceCollectives,
    /// The backend compiles WGSL and enables its optional features.
    Wgsl,
    /// [`Suite::backend`] makes a backend. Read from there, so never listed.
    Backend,
}

impl Capability {
    fn lacked(self) -> &'static str {
        match self {
            Self::Reopen => "the suite's backend does not reopen a lost device",
            Self::DeviceCollectives => "the suite's groups are not over a device transport",
            Self::Wgsl => "the suite's backend does not compile WGSL",
            Self::Backend => "the suite makes no backend (Suite::backend)",
        }
    }
}

/// Whether suite `S` has `capability`.
pub fn has<S: Suite>(capability: Capability) -> bool {
    match capability {
        Capability::Backend => S::backend().is_some(),
        other => S::capabilities().contains(&other),
    }
}

/// Whether `S` has every one of `needs`; if not, prints why the behaviour does not apply.
#[doc(hidden)]
pub fn exercised<S: Suite>(needs: &[Capability]) -> bool {
    let Some(lacked) = needs.iter().find(|need| !has::<S>(**need)) else {
        return true;
    };
    println!("not applicable: {}", lacked.lacked());
    false
}

/// A joined behaviour's fallback: the suite claims collectives its backend lacks.
#[doc(hidden)]
pub fn without_device_collectives<S: Suite>() {
    panic!(
        "the suite lists Capability::DeviceCollectives, but {} does not implement DeviceCollectives",
        std::any::type_name::<S::Backend>()
    );
}

/// `group`, checked against the suite's word on its transport.
pub(crate) fn checked<S: Suite>(group: Group<S::Backend>) -> Group<S::Backend> {
    let listed = has::<S>(Capability::DeviceCollectives);
    assert_eq!(
        group.is_over_device(),
        listed,
        "Suite::group and Suite::capabilities disagree on the device transport"
    );
    group
}

/// One `#[test]` for behaviour `$module::$name` of `$suite`, run when the suite has every `$need`.
/// `joined` marks a behaviour whose backend must implement [`DeviceCollectives`]. A backend without
/// it still compiles.
#[doc(hidden)]
#[macro_export]
macro_rules! behaviour {
    (joined $suite:ty, $module:ident::$name:ident $(, $need:ident)*) => {
        #[test]
        fn $name() {
            // Autoref specialisation: `Joined` applies where the bound holds, and method lookup
            // reaches `Alone` only where not.
            #[allow(dead_code)]
            struct Probe<S>(::core::marker::PhantomData<S>);
            #[allow(dead_code)]
            trait Joined {
                fn run(&self);
            }
            impl<S: $crate::Suite> Joined for Probe<S>
            where
                S::Backend: $crate::kit::DeviceCollectives,
            {
                fn run(&self) {
                    $crate::$module::$name::<S>();
                }
            }
            #[allow(dead_code)]
            trait Alone {
                fn run(&self);
            }
            impl<S: $crate::Suite> Alone for &Probe<S> {
                fn run(&self) {
                    $crate::kit::without_device_collectives::<S>();
                }
            }
            let needs = [$crate::Capability::DeviceCollectives $(, $crate::Capability::$need)*];
            if $crate::kit::exercised::<$suite>(&needs) {
                (&Probe::<$suite>(::core::marker::PhantomData)).run();
                <$suite as $crate::Suite>::finished();
            }
        }
    };
    ($suite:ty, $module:ident::$name:ident $(, $need:ident)*) => {
        #[test]
        fn $name() {
            if $crate::kit::exercised::<$suite>(&[$($crate::Capability::$need),*]) {
                $crate::$module::$name::<$suite>();
                <$suite as $crate::Suite>::finished();
            }
        }
    };
}
