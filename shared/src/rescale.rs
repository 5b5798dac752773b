//! (being written: see issue 2/3)
