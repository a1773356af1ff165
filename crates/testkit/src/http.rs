//! Reading raw HTTP/1.1 in tests that play a client or a server byte by byte.

/// The `Content-Length` of an HTTP head (its lines, up to the blank one); 0 without one or
/// with one that is not a number.
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::content_length;

    #[test]
    fn reads_the_header_in_any_case() {
        assert_eq!(
            content_length("POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n"),
            12
        );
        assert_eq!(content_length("HTTP/1.1 200 OK\r\ncontent-length:3\r\n"), 3);
        assert_eq!(content_length("HTTP/1.1 204 No Content\r\n\r\n"), 0);
    }
}
