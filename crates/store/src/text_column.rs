//! [`text_column!`]: the database's form of an [`acs_wire::text_enum!`],
//! so the word a column stores is the one the enum declares.

/// Makes each named `text_enum!` a PostgreSQL `text` value (and `text[]`):
/// encoded as its word, decoded from its word, and any other word refused as
/// a decode error naming the column's type (a bug or a foreign write, never
/// a caller's mistake). Text domains over `text` read the same.
#[macro_export]
macro_rules! text_column {
    ($($name:ty),+ $(,)?) => {$(
        impl ::sqlx::Type<::sqlx::Postgres> for $name {
            fn type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::type_info()
            }

            fn compatible(ty: &::sqlx::postgres::PgTypeInfo) -> bool {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::compatible(ty)
            }
        }

        impl ::sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl<'q> ::sqlx::Encode<'q, ::sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut ::sqlx::postgres::PgArgumentBuffer,
            ) -> ::core::result::Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                <&str as ::sqlx::Encode<'q, ::sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }

        impl<'r> ::sqlx::Decode<'r, ::sqlx::Postgres> for $name {
            fn decode(
                value: ::sqlx::postgres::PgValueRef<'r>,
            ) -> ::core::result::Result<$name, ::sqlx::error::BoxDynError> {
                let word = <&str as ::sqlx::Decode<'r, ::sqlx::Postgres>>::decode(value)?;
                <$name>::from_text(word).ok_or_else(|| {
                    format!(
                        "{} is not a {}: one of {:?}",
                        word,
                        stringify!($name),
                        <$name>::ALL.map(<$name>::as_str)
                    )
                    .into()
                })
            }
        }
    )+};
}
