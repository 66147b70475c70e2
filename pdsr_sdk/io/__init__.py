"""Reading and writing tables: atomic writes, streamed record batches, ragged columns."""
