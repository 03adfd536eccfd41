//! [`text_enum!`]: an enum whose values are stored and shown as fixed words
//! (a task's status, a presence, a backend's name), with the words written
//! once beside their variants.

/// Declares an enum whose variants each stand for one fixed word, and gives
/// it `ALL` (every variant, in declaration order), `as_str`, `from_text`
/// (the exact word, nothing trimmed or folded: a caller that accepts an
/// operator's spelling normalises first), a `Display` that writes the word
/// (padded, so a caller's width applies), serde's form (the word; any other
/// is refused naming the words) and `Clone, Copy, Debug, PartialEq, Eq,
/// Hash`. The store's `text_column!` adds the database's form, so a word is
/// written once for every place it appears.
///
/// ```ignore
/// acs_wire::text_enum! {
///     /// How a window says it is doing.
///     pub enum PresenceStatus {
///         Active = "active",
///         Idle = "idle",
///     }
/// }
/// ```
#[macro_export]
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$(stringify!($variant)),+].len()] = [$($name::$variant),+];

            /// The value's word.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text ),+
                }
            }

            /// The value whose word is exactly `text`.
            pub fn from_text(text: &str) -> ::core::option::Option<$name> {
                match text {
                    $( $text => ::core::option::Option::Some($name::$variant), )+
                    _ => ::core::option::Option::None,
                }
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl $crate::__serde::Serialize for $name {
            fn serialize<S: $crate::__serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::core::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> $crate::__serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::__serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::core::result::Result<$name, D::Error> {
                let word = <::std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                $name::from_text(&word).ok_or_else(|| {
                    <D::Error as $crate::__serde::de::Error>::unknown_variant(&word, &[$($text),+])
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::text_enum! {
        enum Weather {
            /// Documented variants keep their docs.
            Sunny = "sunny",
            HeavyRain = "heavy_rain",
        }
    }

    #[test]
    fn each_value_has_its_word_both_ways_and_displays_padded() {
        assert_eq!(Weather::ALL, [Weather::Sunny, Weather::HeavyRain]);
        for value in Weather::ALL {
            assert_eq!(Weather::from_text(value.as_str()), Some(value));
            assert_eq!(
                serde_json::to_value(value).unwrap(),
                value.as_str(),
                "serde writes the word"
            );
            let read: Weather = serde_json::from_value(value.as_str().into()).unwrap();
            assert_eq!(read, value, "and reads it");
        }
        let unknown = serde_json::from_value::<Weather>("Sunny".into()).unwrap_err();
        assert!(
            unknown.to_string().contains("`sunny`") && unknown.to_string().contains("`heavy_rain`"),
            "an unknown word names the known ones: {unknown}"
        );
        assert_eq!(Weather::from_text("Sunny"), None, "exact words only");
        assert_eq!(format!("[{:<10}]", Weather::HeavyRain), "[heavy_rain]");
        assert_eq!(format!("[{:<7}]", Weather::Sunny), "[sunny  ]");
    }
}
