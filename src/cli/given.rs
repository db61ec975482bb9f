//! A flattened group of flags together with the names of those the command
//! line gave (as opposed to defaults), for commands that must refuse flags
//! that cannot apply: `fsdpc train plan.json` cannot re-plan a compiled plan.

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use std::ops::Deref;

/// Flags `T`, and the long names (`--strategy`) of the ones given on the
/// command line. Dereferences to `T`.
#[derive(Debug, Clone)]
pub struct Given<T> {
    flags: T,
    given: Vec<String>,
}

impl<T> Given<T> {
    /// The flags of `T` the command line gave, as `--name`, in declaration order.
    pub fn given(&self) -> &[String] {
        &self.given
    }
}

impl<T> Deref for Given<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.flags
    }
}

/// The long names of `T`'s arguments whose value came from the command line.
fn explicit<T: Args>(m: &ArgMatches) -> Vec<String> {
    T::augment_args(Command::new("flags"))
        .get_arguments()
        .filter(|a| m.value_source(a.get_id().as_str()) == Some(ValueSource::CommandLine))
        .map(|a| match a.get_long() {
            Some(long) => format!("--{long}"),
            None => a.get_id().to_string(),
        })
        .collect()
}

impl<T: FromArgMatches + Args> FromArgMatches for Given<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(Given {
            flags: T::from_arg_matches(m)?,
            given: explicit::<T>(m),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        self.flags.update_from_arg_matches(m)?;
        for name in explicit::<T>(m) {
            if !self.given.contains(&name) {
                self.given.push(name);
            }
        }
        Ok(())
    }
}

impl<T: Args> Args for Given<T> {
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }

    fn augment_args(cmd: Command) -> Command {
        T::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        T::augment_args_for_update(cmd)
    }
}
