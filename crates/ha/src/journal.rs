//! The join intent journal.
