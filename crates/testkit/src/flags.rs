//! The command line of the benchmarks: `--flag value` pairs, and switches that stand alone.

/// What reading a command line fails with.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Reads the command line as `--flag value` pairs, each given to `set`, which answers
/// whether it takes that flag: an unknown flag, or one without a value, is an error.
pub fn flag_values(set: impl FnMut(&str, String) -> Result<bool, Error>) -> Result<(), Error> {
    flags_and_switches(&[], set)
}

/// [`flag_values`], where a flag named in `switches` stands alone: it is given an empty
/// value.
pub fn flags_and_switches(
    switches: &[&str],
    set: impl FnMut(&str, String) -> Result<bool, Error>,
) -> Result<(), Error> {
    read_flags(std::env::args().skip(1), switches, set)
}

/// [`flags_and_switches`] over `args` (the command line without the program's name).
fn read_flags(
    mut args: impl Iterator<Item = String>,
    switches: &[&str],
    mut set: impl FnMut(&str, String) -> Result<bool, Error>,
) -> Result<(), Error> {
    while let Some(flag) = args.next() {
        let value = if switches.contains(&flag.as_str()) {
            String::new()
        } else {
            args.next().ok_or(format!("{flag} needs a value"))?
        };
        if !set(&flag, value)? {
            return Err(format!("unknown flag {flag}").into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs `args` gives, with `--quiet` a switch and only `--n` and `--quiet` known.
    fn read(args: &[&str]) -> Result<Vec<(String, String)>, String> {
        let mut seen = Vec::new();
        read_flags(
            args.iter().map(|a| (*a).to_owned()),
            &["--quiet"],
            |flag, value| {
                seen.push((flag.to_owned(), value));
                Ok(matches!(flag, "--n" | "--quiet"))
            },
        )
        .map_err(|e| e.to_string())?;
        Ok(seen)
    }

    #[test]
    fn pairs_and_switches_are_read_in_order() {
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(f, v)| ((*f).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(read(&[]), Ok(Vec::new()));
        assert_eq!(
            read(&["--n", "3", "--quiet", "--n", "4"]),
            Ok(pairs(&[("--n", "3"), ("--quiet", ""), ("--n", "4")]))
        );
    }

    #[test]
    fn an_unknown_flag_or_a_missing_value_is_an_error() {
        assert_eq!(read(&["--m", "1"]), Err("unknown flag --m".to_owned()));
        assert_eq!(read(&["--n"]), Err("--n needs a value".to_owned()));
    }
}
