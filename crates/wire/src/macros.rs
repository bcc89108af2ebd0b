//! The code generator behind every fixed-layout message family (ITCH 5.0,
//! OUCH 5.0 inbound and outbound).
//!
//! One table per family lists each message's type byte, its exact length and
//! its fields in wire order. From it `messages!` generates, for each message:
//! a zero-copy view over the received bytes (getters at compile-time offsets),
//! a plain value type (`*Repr`) with `emit`, and a compile-time assertion that
//! the field widths add up to the specified length; and for the family: a
//! `Message` enum of views with `parse`, a `MessageRepr` enum of values, and a
//! length table by type byte. The specification's tables thus live in one place
//! and the layout cannot drift between decode and encode.

/// A variable-length tail after a message's fixed part (OUCH's optional
/// appendage). The fixed part's last two bytes hold the tail's length.
pub trait Tail: Copy {
    /// Builds the value from the tail bytes; `None` when they exceed the capacity.
    fn from_slice(b: &[u8]) -> Option<Self>;
    /// The tail bytes.
    fn as_slice(&self) -> &[u8];
}

/// The whole received bytes of a message that has a tail; views of fixed-size
/// messages do without it and stay one pointer wide.
#[derive(Clone, Copy)]
pub struct TailRef<'a, T>(&'a [u8], core::marker::PhantomData<T>);

impl<'a, T> TailRef<'a, T> {
    #[doc(hidden)]
    pub fn new(b: &'a [u8]) -> Self {
        TailRef(b, core::marker::PhantomData)
    }

    #[doc(hidden)]
    pub fn whole(&self) -> &'a [u8] {
        self.0
    }
}

macro_rules! has_tail {
    () => {
        false
    };
    ($t:ty) => {
        true
    };
}

macro_rules! getters {
    ($off:expr;) => {};
    ($off:expr; $(#[$fm:meta])* $field:ident : $fty:ty $(, $($rest:tt)*)?) => {
        $(#[$fm])*
        #[doc = ""]
        #[doc = concat!("Wire field `", stringify!($field), "` (`", stringify!($fty), "`), named as in the specification.")]
        #[inline(always)]
        pub fn $field(&self) -> $fty {
            const OFF: usize = $off;
            <$fty as $crate::field::Field>::read(
                &self.fixed[OFF..OFF + <$fty as $crate::field::Field>::LEN],
            )
        }
        getters!($off + <$fty as $crate::field::Field>::LEN; $($($rest)*)?);
    };
}

macro_rules! message_one {
    (
        $proto:expr,
        { $( $(#[$hm:meta])* $hfield:ident : $hty:ty ),* $(,)? },
        $(#[$m:meta])*
        $name:ident / $repr:ident = $code:literal, $len:literal $(, tail = $tail:ty)? {
            $( $(#[$fm:meta])* $field:ident : $fty:ty ),* $(,)?
        }
    ) => {
            $(#[$m])*
            ///
            /// A zero-copy view; [`Self::new_checked`] validates type and length
            /// before any getter can run.
            #[derive(Clone, Copy)]
            pub struct $name<'a> {
                #[allow(dead_code)] // unread by field-less messages
                fixed: &'a [u8; $len],
                $(tail: $crate::macros::TailRef<'a, $tail>,)?
            }

            const _: () = assert!(
                1 $(+ <$hty as $crate::field::Field>::LEN)*
                  $(+ <$fty as $crate::field::Field>::LEN)* == $len
            );

            impl<'a> $name<'a> {
                /// The type byte.
                pub const TYPE: u8 = $code;
                /// The specified length (of the fixed part, if a tail may follow).
                pub const LEN: usize = $len;

                /// Validates type byte and length, then wraps `b` without copying.
                pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
                    if b.first() != Some(&$code) {
                        return Err(Error::Malformed { protocol: $proto, reason: "type byte mismatch" });
                    }
                    let len_ok = if has_tail!($($tail)?) { b.len() >= $len } else { b.len() == $len };
                    let fixed = match b.get(..$len).and_then(|s| <&[u8; $len]>::try_from(s).ok()) {
                        Some(f) if len_ok => f,
                        _ => {
                            return Err(Error::BadLength {
                                protocol: $proto,
                                msg_type: $code,
                                expected: $len,
                                actual: b.len(),
                            })
                        }
                    };
                    let v = Self { fixed, $(tail: $crate::macros::TailRef::<'a, $tail>::new(b),)? };
                    $(
                        let declared = usize::from(u16::from_be_bytes([fixed[$len - 2], fixed[$len - 1]]));
                        if declared != b.len() - $len || <$tail as $crate::macros::Tail>::from_slice(v.tail()).is_none() {
                            return Err(Error::BadLength {
                                protocol: $proto,
                                msg_type: $code,
                                expected: $len + declared,
                                actual: b.len(),
                            });
                        }
                    )?
                    Ok(v)
                }

                /// The whole message as received.
                #[inline]
                #[allow(unreachable_code)]
                pub fn as_bytes(&self) -> &'a [u8] {
                    $(return <$crate::macros::TailRef<'a, $tail>>::whole(&self.tail);)?
                    &self.fixed[..]
                }

                /// Bytes after the fixed part (empty unless the message allows a tail).
                #[inline]
                pub fn tail(&self) -> &'a [u8] {
                    &self.as_bytes()[$len..]
                }

                getters!(1; $($(#[$hm])* $hfield : $hty,)* $($(#[$fm])* $field : $fty),*);

                /// Copies the fields into a plain value.
                pub fn to_repr(&self) -> $repr {
                    $repr {
                        $($hfield: self.$hfield(),)*
                        $($field: self.$field(),)*
                        $(appendage: match <$tail as $crate::macros::Tail>::from_slice(self.tail()) {
                            Some(t) => t,
                            None => <$tail>::default(), // unreachable: checked in new_checked
                        },)?
                    }
                }

                /// Calls `f` with each field's name and value in wire order.
                #[allow(unused_variables)]
                pub fn visit(&self, f: &mut dyn FnMut(&'static str, $crate::field::FieldValue)) {
                    $(f(stringify!($hfield), $crate::field::Field::value(self.$hfield()));)*
                    $(f(stringify!($field), $crate::field::Field::value(self.$field()));)*
                }
            }

            impl core::fmt::Debug for $name<'_> {
                fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                    core::fmt::Debug::fmt(&self.to_repr(), f)
                }
            }

            $(#[$m])*
            ///
            /// The plain value form, for building and emitting messages.
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
            pub struct $repr {
                $($(#[$hm])*
                    #[doc = ""]
                    #[doc = concat!("Wire field `", stringify!($hfield), "` (`", stringify!($hty), "`), named as in the specification.")]
                    pub $hfield: $hty,)*
                $($(#[$fm])*
                    #[doc = ""]
                    #[doc = concat!("Wire field `", stringify!($field), "` (`", stringify!($fty), "`), named as in the specification.")]
                    pub $field: $fty,)*
                $(
                    /// Optional appendage after the fixed part; its length is
                    /// written into the length field by `emit`.
                    pub appendage: $tail,
                )?
            }

            impl $repr {
                /// The type byte.
                pub const TYPE: u8 = $code;

                /// Bytes `emit` writes.
                pub fn buffer_len(&self) -> usize {
                    $len $(+ <$tail as $crate::macros::Tail>::as_slice(&self.appendage).len())?
                }

                /// Writes exactly `buffer_len()` bytes at the front of `buf`.
                pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
                    let n = self.buffer_len();
                    $crate::error::check_len(buf, n)?;
                    let buf = &mut buf[..n];
                    buf[0] = $code;
                    #[allow(unused_mut)]
                    let mut off = 1;
                    $(
                        <$hty as $crate::field::Field>::write(
                            self.$hfield, &mut buf[off..off + <$hty as $crate::field::Field>::LEN]);
                        off += <$hty as $crate::field::Field>::LEN;
                    )*
                    $(
                        <$fty as $crate::field::Field>::write(
                            self.$field, &mut buf[off..off + <$fty as $crate::field::Field>::LEN]);
                        off += <$fty as $crate::field::Field>::LEN;
                    )*
                    debug_assert_eq!(off, $len);
                    $(
                        let t = <$tail as $crate::macros::Tail>::as_slice(&self.appendage);
                        buf[$len..].copy_from_slice(t);
                        buf[$len - 2..$len].copy_from_slice(&(t.len() as u16).to_be_bytes());
                    )?
                    let _ = off;
                    Ok(n)
                }
            }
            };
}

macro_rules! messages {
    (
        protocol = $proto:expr;
        header $h:tt
        $(
            $(#[$m:meta])*
            $name:ident / $repr:ident = $code:literal, $len:literal $(, tail = $tail:ty)? {
                $( $(#[$fm:meta])* $field:ident : $fty:ty ),* $(,)?
            }
        )*
    ) => {
        $(
            message_one! {
                $proto,
                $h,
                $(#[$m])*
                $name / $repr = $code, $len $(, tail = $tail)? {
                    $( $(#[$fm])* $field : $fty ),*
                }
            }
        )*

        /// Any message of this family, as a zero-copy view.
        #[derive(Clone, Copy, Debug)]
        pub enum Message<'a> {
            $($(#[$m])* $name($name<'a>),)*
        }

        /// Any message of this family, as a plain value.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum MessageRepr {
            $($(#[$m])* $name($repr),)*
        }

        /// Specified length by type byte (0: unknown type), for checks without dispatch.
        pub const LENGTHS: [u16; 256] = {
            let mut t = [0u16; 256];
            $(t[$code as usize] = $len;)*
            t
        };

        /// Every type byte of this family, in specification order.
        pub const TYPES: &[u8] = &[$($code),*];

        /// The specified length of a message type (its fixed part, where a tail may follow).
        #[inline]
        pub const fn spec_len(msg_type: u8) -> Option<usize> {
            match msg_type {
                $($code => Some($len),)*
                _ => None,
            }
        }

        /// The message type's name as in this crate (`AddOrder`, ...).
        pub const fn type_name(msg_type: u8) -> Option<&'static str> {
            match msg_type {
                $($code => Some(stringify!($name)),)*
                _ => None,
            }
        }

        impl<'a> Message<'a> {
            /// Decodes one message: a known type byte and the exact specified length.
            #[inline]
            pub fn parse(b: &'a [u8]) -> Result<Self, Error> {
                let Some(&t) = b.first() else {
                    return Err(Error::Truncated { needed: 1, available: 0 });
                };
                match t {
                    $($code => Ok(Message::$name($name::new_checked(b)?)),)*
                    _ => Err(Error::UnknownType { protocol: $proto, msg_type: t }),
                }
            }

            /// The type byte.
            #[inline]
            pub fn msg_type(&self) -> u8 {
                match self { $(Message::$name(_) => $code,)* }
            }

            /// The type's name.
            pub fn name(&self) -> &'static str {
                match self { $(Message::$name(_) => stringify!($name),)* }
            }

            /// The message as received.
            #[inline]
            pub fn as_bytes(&self) -> &'a [u8] {
                match self { $(Message::$name(v) => v.as_bytes(),)* }
            }

            /// Copies the message into its value form.
            pub fn to_repr(&self) -> MessageRepr {
                match self { $(Message::$name(v) => MessageRepr::$name(v.to_repr()),)* }
            }

            /// Calls `f` with each field's name and value in wire order.
            pub fn visit(&self, f: &mut dyn FnMut(&'static str, $crate::field::FieldValue)) {
                match self { $(Message::$name(v) => v.visit(f),)* }
            }
        }

        impl MessageRepr {
            /// The type byte.
            pub fn msg_type(&self) -> u8 {
                match self { $(MessageRepr::$name(_) => $code,)* }
            }

            /// Bytes `emit` writes.
            pub fn buffer_len(&self) -> usize {
                match self { $(MessageRepr::$name(r) => r.buffer_len(),)* }
            }

            /// Writes exactly `buffer_len()` bytes at the front of `buf`.
            pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
                match self { $(MessageRepr::$name(r) => r.emit(buf),)* }
            }
        }

        $(
            impl From<$repr> for MessageRepr {
                fn from(r: $repr) -> Self {
                    MessageRepr::$name(r)
                }
            }
        )*
    };
}
