//! Reading raw HTTP/1.1 in tests that play a client or a server byte by byte.

/// An HTTP/1.1 head: the `start` line (a request's or a status line), each of `headers`
/// as `name: value`, and the blank line that ends it.
pub fn head(start: &str, headers: &[(&str, &str)]) -> String {
    let mut head = format!("{start}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head + "\r\n"
}

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
    use super::{content_length, head};

    #[test]
    fn writes_a_head_that_reads_back() {
        let written = head(
            "POST /v1 HTTP/1.1",
            &[("host", "x"), ("content-length", "12")],
        );
        assert_eq!(
            written,
            "POST /v1 HTTP/1.1\r\nhost: x\r\ncontent-length: 12\r\n\r\n"
        );
        assert_eq!(content_length(&written), 12);
        assert_eq!(
            head("HTTP/1.1 204 No Content", &[]),
            "HTTP/1.1 204 No Content\r\n\r\n"
        );
    }

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
