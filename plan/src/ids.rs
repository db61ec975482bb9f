//! The typed ids a plan refers to its units, buffers and events by.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);
        impl $name {
            pub fn index(self) -> usize { self.0 as usize }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    )*};
}

id_type! {
    /// Index into `Plan::units`.
    UnitId;
    /// Index into `Plan::buffers`.
    BufferId;
    /// An event recorded by one stream and waited on by others (`0..Plan::events`).
    EventId;
}
