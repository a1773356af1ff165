//! [`Tokens`], the token counts of one agent run or one model call.

/// The tokens of one run or one model call: all input (of which some was read from or
/// written to the prompt cache) and output.
///
/// `input` counts every input token; `cache_read` and `cache_write` are parts of it.
/// Providers that report the uncached input apart (Anthropic, the ledger's columns) convert
/// with [`Tokens::from_uncached`] and [`Tokens::uncached`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// All input tokens: uncached, read from the cache and written to it.
    pub input: i64,
    /// The part of `input` read from the prompt cache.
    pub cache_read: i64,
    /// The part of `input` written to the prompt cache.
    pub cache_write: i64,
    /// Output tokens (reasoning included).
    pub output: i64,
}

impl Tokens {
    /// The tokens of a split into uncached input, cache reads, cache writes and output: the
    /// input is their (saturating) sum.
    pub fn from_uncached(uncached: i64, cache_read: i64, cache_write: i64, output: i64) -> Tokens {
        Tokens {
            input: uncached
                .saturating_add(cache_read)
                .saturating_add(cache_write),
            cache_read,
            cache_write,
            output,
        }
    }

    /// The input neither read from nor written to the prompt cache: `input − cache_read −
    /// cache_write` (saturating; negative when the cache parts exceed the input).
    pub fn uncached(self) -> i64 {
        self.input
            .saturating_sub(self.cache_read)
            .saturating_sub(self.cache_write)
    }

    /// Each count summed with `other`'s, saturating at the bounds of `i64`.
    pub fn saturating_add(self, other: Tokens) -> Tokens {
        Tokens {
            input: self.input.saturating_add(other.input),
            cache_read: self.cache_read.saturating_add(other.cache_read),
            cache_write: self.cache_write.saturating_add(other.cache_write),
            output: self.output.saturating_add(other.output),
        }
    }

    /// Each count summed with `other`'s; `None` if one overflows.
    pub fn checked_add(self, other: Tokens) -> Option<Tokens> {
        Some(Tokens {
            input: self.input.checked_add(other.input)?,
            cache_read: self.cache_read.checked_add(other.cache_read)?,
            cache_write: self.cache_write.checked_add(other.cache_write)?,
            output: self.output.checked_add(other.output)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uncached_split_round_trips_and_sums_saturate_or_fail() {
        let t = Tokens::from_uncached(100, 2_000, 30, 7);
        assert_eq!(t.input, 2_130);
        assert_eq!(t.uncached(), 100);
        assert_eq!(
            t.saturating_add(t),
            Tokens::from_uncached(200, 4_000, 60, 14)
        );
        assert_eq!(t.checked_add(t), Some(t.saturating_add(t)));
        let max = Tokens {
            output: i64::MAX,
            ..Tokens::default()
        };
        assert_eq!(max.checked_add(t), None);
        assert_eq!(max.saturating_add(t).output, i64::MAX);
    }
}
