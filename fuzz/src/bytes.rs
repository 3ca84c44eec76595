//! Structured values drawn from fuzz input, for targets whose input is not text.
//!
//! Reading past the end yields zeros, so every input builds something and the fuzzer's
//! mutations of one byte change one choice.

pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::from(self.byte()) % n
        }
    }

    pub fn bool(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// True for about one input byte value in `one_in`: rare branches, such as oversized fields.
    pub fn rarely(&mut self, one_in: u8) -> bool {
        self.byte().is_multiple_of(one_in.max(1))
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `max` bytes, as UTF-8 (invalid sequences replaced).
    pub fn string(&mut self, max: usize) -> String {
        let len = self.below(max + 1).min(self.data.len());
        let (head, rest) = self.data.split_at(len);
        self.data = rest;
        String::from_utf8_lossy(head).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_order_then_zeros() {
        let mut b = Bytes::new(&[7, 1, 2, b'h', b'i']);
        assert_eq!(b.below(5), 2);
        assert!(b.bool());
        assert_eq!(b.string(3), "hi");
        assert_eq!(b.byte(), 0);
        assert_eq!(b.u32(), 0);
        assert_eq!(b.below(0), 0);
    }
}
