//! Per-call context: who acts, for which run, with which credential, against which server.
//!
//! These values enter the intent fingerprint and the ledger. They are small, cheaply cloned
//! newtypes so they can travel in [`http::Extensions`] next to a request and override the guard's
//! defaults for that one call.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! context_newtype {
    ($(#[$doc:meta])* $name:ident, example = $example:literal) => {
        $(#[$doc])*
        ///
        /// # Clone
        ///
        /// Cloning is cheap: the value is a reference-counted string.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            #[doc = concat!("Wraps a value, e.g. `", $example, "`.")]
            pub fn new(value: impl Into<Arc<str>>) -> Self {
                Self(value.into())
            }

            /// The value as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::new(value)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self::new(value)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map(Self::from)
            }
        }
    };
}

context_newtype!(
    /// Who performs the action: a signed process, a service account, an agent identity.
    Actor,
    example = "signed-process:com.example.agent"
);
context_newtype!(
    /// The window of meaning in which two identical requests are the same intent, such as one
    /// agent run. Two calls in different scopes are never linked, whatever their arguments.
    IntentScope,
    example = "run:5f8097"
);
context_newtype!(
    /// A reference to the credential the call is made with (never the credential itself).
    CredentialRef,
    example = "deploy-service"
);
context_newtype!(
    /// The server or API that performs the action, e.g. an MCP endpoint without its scheme.
    Target,
    example = "deploy-api.internal.example/mcp"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newtypes_display_serialize_and_compare_by_value() {
        let actor = Actor::new("signed-process:com.example.agent");
        assert_eq!(actor.to_string(), "signed-process:com.example.agent");
        assert_eq!(
            serde_json::to_string(&actor).unwrap(),
            "\"signed-process:com.example.agent\""
        );
        let back: Actor = serde_json::from_str("\"signed-process:com.example.agent\"").unwrap();
        assert_eq!(back, actor);
        assert_ne!(IntentScope::from("run:1"), IntentScope::from("run:2"));
        assert_eq!(format!("{:?}", Target::from("a/mcp")), "Target(\"a/mcp\")");
    }
}
