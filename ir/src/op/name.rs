//! `Op::name` without serialising the op: a serde serializer that keeps the
//! `op` tag and the `f` field (a function's variant) and skips every other
//! field unread. The planner names every kernel it lowers, so this runs
//! once per instruction of every plan.

use serde::ser::{self, Impossible, Serialize};
use std::fmt;

/// The tag and the function of a serialised op.
#[derive(Default)]
pub(super) struct Name {
    pub op: Option<String>,
    pub f: Option<String>,
}

impl Name {
    pub fn of(value: &impl Serialize) -> Name {
        let mut name = Name::default();
        // An op that is not a struct or a map has no fields to read: no name.
        let _ = value.serialize(Fields(&mut name));
        name
    }

    fn take(&mut self, key: &str, value: &(impl Serialize + ?Sized)) {
        let slot = match key {
            "op" => &mut self.op,
            "f" => &mut self.f,
            _ => return,
        };
        *slot = value.serialize(Word).ok();
    }
}

/// What the name serializer refuses (everything but what it reads).
#[derive(Debug)]
pub(super) struct Skip;

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not part of an op's name")
    }
}

impl std::error::Error for Skip {}

impl ser::Error for Skip {
    fn custom<T: fmt::Display>(_: T) -> Skip {
        Skip
    }
}

/// Refuses every kind of value its list names.
macro_rules! refuse {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<Self::Ok, Skip> { Err(Skip) })*
    };
}

/// Refuses the compound kinds of value.
macro_rules! refuse_compound {
    () => {
        type SerializeSeq = Impossible<Self::Ok, Skip>;
        type SerializeTuple = Impossible<Self::Ok, Skip>;
        type SerializeTupleStruct = Impossible<Self::Ok, Skip>;
        type SerializeTupleVariant = Impossible<Self::Ok, Skip>;
        type SerializeStructVariant = Impossible<Self::Ok, Skip>;

        refuse!(
            serialize_bool(bool),
            serialize_i8(i8),
            serialize_i16(i16),
            serialize_i32(i32),
            serialize_i64(i64),
            serialize_u8(u8),
            serialize_u16(u16),
            serialize_u32(u32),
            serialize_u64(u64),
            serialize_f32(f32),
            serialize_f64(f64),
            serialize_char(char),
            serialize_bytes(&[u8]),
            serialize_none(),
            serialize_unit(),
            serialize_unit_struct(&'static str),
        );

        fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<Self::Ok, Skip> {
            Err(Skip)
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: &T,
        ) -> Result<Self::Ok, Skip> {
            Err(Skip)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<Self::Ok, Skip> {
            Err(Skip)
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Skip> {
            Err(Skip)
        }
        fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Skip> {
            Err(Skip)
        }
        fn serialize_tuple_struct(
            self,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleStruct, Skip> {
            Err(Skip)
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, Skip> {
            Err(Skip)
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, Skip> {
            Err(Skip)
        }
    };
}

/// A string, or a unit variant's name (`UnaryFn::GeluTanh` as
/// `gelu_tanh`); nothing else.
struct Word;

impl ser::Serializer for Word {
    type Ok = String;
    type Error = Skip;
    type SerializeMap = Impossible<String, Skip>;
    type SerializeStruct = Impossible<String, Skip>;
    refuse_compound!();

    fn serialize_str(self, v: &str) -> Result<String, Skip> {
        Ok(v.to_string())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, Skip> {
        Ok(variant.to_string())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Skip> {
        Err(Skip)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Skip> {
        Err(Skip)
    }
}

/// The op itself: a struct (or a map) whose `op` and `f` fields it reads.
struct Fields<'a>(&'a mut Name);

/// A map's key waiting for its value.
struct Entries<'a> {
    name: &'a mut Name,
    key: Option<String>,
}

impl<'a> ser::Serializer for Fields<'a> {
    type Ok = ();
    type Error = Skip;
    type SerializeMap = Entries<'a>;
    type SerializeStruct = Fields<'a>;
    refuse_compound!();

    fn serialize_str(self, _: &str) -> Result<(), Skip> {
        Err(Skip)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Skip> {
        Err(Skip)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Entries<'a>, Skip> {
        Ok(Entries {
            name: self.0,
            key: None,
        })
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Fields<'a>, Skip> {
        Ok(self)
    }
}

impl ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = Skip;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Skip> {
        self.0.take(key, value);
        Ok(())
    }
    fn end(self) -> Result<(), Skip> {
        Ok(())
    }
}

impl ser::SerializeMap for Entries<'_> {
    type Ok = ();
    type Error = Skip;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Skip> {
        self.key = key.serialize(Word).ok();
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Skip> {
        if let Some(key) = self.key.take() {
            self.name.take(&key, value);
        }
        Ok(())
    }
    fn end(self) -> Result<(), Skip> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::op::{BinaryFn, CompareFn, Op, ReduceFn, UnaryFn};

    /// The name as the serialised op spells it: its tag, and its function
    /// after a dot.
    fn spelled(op: &Op) -> String {
        let v = serde_json::to_value(op).expect("serialises");
        let base = v["op"].as_str().expect("tagged").to_string();
        match v.get("f").and_then(|f| f.as_str()) {
            Some(f) => format!("{base}.{f}"),
            None => base,
        }
    }

    #[test]
    fn names_are_the_serialised_tag_and_function() {
        let ops = [
            Op::Not,
            Op::Where,
            Op::Input { name: "ids".into() },
            Op::Unary { f: UnaryFn::Exp },
            Op::Binary { f: BinaryFn::Add },
            Op::Compare {
                f: CompareFn::LessOrEqual,
            },
            Op::MatMul {
                trans_a: false,
                trans_b: true,
            },
            Op::Reshape {
                shape: vec![2, 3, 4],
            },
            Op::Dropout {
                p: 0.1,
                seed: 7,
                whole_sample: None,
            },
            Op::Attention {
                causal: true,
                scale: 0.125,
            },
            Op::Reduce {
                f: ReduceFn::Mean,
                axes: vec![1],
                keepdims: true,
            },
        ];
        for op in &ops {
            assert_eq!(op.name(), spelled(op), "{op:?}");
        }
    }
}
