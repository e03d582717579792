//! The order of a wire type's fields as its Rust declaration has them, asked of serde.
//!
//! The schema's properties come sorted by name (`serde_json` without `preserve_order`, which the crate
//! leaves off: it would reorder every map the hub writes and every generated page). A reader expects
//! `controller, parent, children, related, finalizing`, and TypeScript's type parameters need it:
//! `CompositeRequest<Parent, Children, Related>` takes them in field order.

use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Serialize, forward_to_deserialize_any};

/// The type's name and JSON field names, in order, as serde's derived `Deserialize` asks for them.
#[must_use]
pub fn deserialized<T: DeserializeOwned>() -> (String, Vec<String>) {
    let mut found = None;
    // The probe answers every request with an error; only what it was asked for matters.
    let _ = T::deserialize(Probe(&mut found));
    let (name, fields) = found.unwrap_or_else(|| (std::any::type_name::<T>(), &[]));
    (name.to_owned(), fields.iter().map(|&f| f.to_owned()).collect())
}

/// The JSON keys of `value`, in the order serde writes them.
#[must_use]
pub fn serialized<T: Serialize>(value: &T) -> Vec<String> {
    let text = serde_json::to_string(value).expect("a wire type serializes");
    serde_json::from_str::<Keys>(&text).map(|k| k.0).unwrap_or_default()
}

/// A deserializer that records which struct it was asked for.
struct Probe<'a>(&'a mut Option<(&'static str, &'static [&'static str])>);

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some((name, fields));
        Err(de::Error::custom("probed"))
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// A JSON object's keys, in the order of the text.
struct Keys(Vec<String>);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        deserializer.deserialize_map(KeysVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sample {
        zulu: u8,
        alpha_beta: u8,
        #[serde(rename = "type")]
        type_: u8,
    }

    #[test]
    fn fields_come_in_declaration_order_with_their_json_names() {
        let expected = ["zulu", "alphaBeta", "type"].map(String::from).to_vec();
        assert_eq!(deserialized::<Sample>(), ("Sample".to_owned(), expected.clone()));
        assert_eq!(serialized(&Sample { zulu: 0, alpha_beta: 0, type_: 0 }), expected);
    }
}
