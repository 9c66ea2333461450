//! Text tables and JSON documents.
