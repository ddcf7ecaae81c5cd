// Package checkpoint defines pstrain's on-disk checkpoint format and its
// atomic writer, verifier, reader and retention.
//
// # Layout
//
// A checkpoint of global step N is a directory of the store's directory
// DIR:
//
//	DIR/ckpt-000000000200/                 step zero-padded to 12 digits
//	    shard-0-of-2.safetensors           one file per parameter-server shard
//	    shard-1-of-2.safetensors
//	    MANIFEST.json                      written last
//
// Each shard file is a safetensors file (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length H, H bytes of JSON header mapping
// each tensor name to {"dtype":"F32","shape":[...],"data_offsets":[b,e]}
// plus an optional "__metadata__" object of strings, padded with spaces to
// a multiple of 8 bytes, then the tensors' little-endian data, contiguous.
// A shard holds its slice of the model's variables (e.g. "layer0/w[0:392]")
// and the optimizer state for them (e.g. "layer0/w[0:392]/m"); names are
// opaque strings here. Only F32 is written; reading rejects other dtypes
// with ErrUnsupportedDtype and any structural damage with ErrCorrupt.
//
// MANIFEST.json (Manifest) records the format version, step, parameter
// version, training mode, the opaque model spec and run configuration, the
// optimizer and its hyperparameters, and for each shard its file name,
// size, SHA-256 and tensor names. Its "checksum" field is the SHA-256 of
// the manifest's canonical JSON with that field empty, so a damaged
// manifest is detected too.
//
// A checkpoint is complete only if it is a directory named ckpt-<step>
// (no suffix) whose manifest exists and verifies. ckpt-<step>.tmp is a
// checkpoint being written; ckpt-<step>.trash one being deleted; neither
// is ever loaded.
//
// # Commit protocol
//
// Each parameter server writes its shard with Store.WriteShard, possibly
// concurrently with the others, each from its own process:
//
//  1. create DIR/ckpt-N.tmp/ if missing and fsync DIR;
//  2. write the shard to a uniquely named temporary file in it, hashing
//     the bytes with SHA-256;
//  3. fsync the file, rename it to shard-i-of-S.safetensors, fsync
//     ckpt-N.tmp/.
//
// When every shard is durable, the chief calls Store.Commit with a
// Manifest listing the returned ShardInfos:
//
//  4. check each listed shard file's size and SHA-256 (re-reading it);
//  5. write MANIFEST.json through a temporary file, fsync, rename, fsync
//     ckpt-N.tmp/;
//  6. rename ckpt-N.tmp to ckpt-N and fsync DIR: the commit point;
//  7. only then delete complete checkpoints beyond the newest `keep`
//     (renaming each to .trash first), and .tmp directories of earlier
//     steps.
//
// A crash at any point leaves either the previous checkpoint or the new
// one as the newest valid checkpoint: the new one becomes visible under
// its final name only by the atomic rename of step 6, after all its files
// are durable, and nothing old is deleted before that rename is durable.
// The tests check this by crashing an in-memory filesystem (MemFS) at
// every operation of a write sequence (FaultFS) and dropping everything
// not yet fsynced.
//
// # Full disks and leftovers
//
// A write of a shard or of the manifest that fails because the disk is
// full (ENOSPC or EDQUOT; IsDiskFull) frees space and is retried once:
// temporary directories of other steps and interrupted deletions go, and
// so does every complete checkpoint older than the newest one that
// verifies fully. That checkpoint, anything newer, and the temporary
// directory being written are never deleted; with no valid checkpoint no
// checkpoint is. The error of a second failure names what was deleted.
// Store.RemoveTemporaries deletes every ckpt-<step>.tmp and .trash
// directory: the chief calls it before and after each checkpoint
// attempt, when none is in flight, so a failed attempt leaves nothing
// behind.
//
// # Archives
//
// Store.Archive moves a finished or abandoned run's checkpoints into
// DIR/archive-<time>/ (UTC, to the millisecond, so the names sort in time
// order) when a new run starts; Store.PruneArchives deletes the oldest
// archives beyond a number to keep.
//
// # Reading
//
// Store.List lists the complete checkpoints newest first with a cheap
// check (manifest and file sizes); Store.Verify also checks every shard's
// SHA-256; Store.Latest returns the newest checkpoint that verifies fully,
// with the newer invalid ones it skipped; when there are checkpoints but
// none verifies, its error wraps ErrAllDamaged and names each. Store.Load opens a checkpoint and
// Checkpoint.ReadShard reads a shard, verifying its hash in the same pass.
//
// # Filesystem
//
// All I/O goes through the FS interface: OSFS is the real filesystem;
// MemFS simulates crashes; FaultFS injects errors or crashes at the k-th
// operation.
package checkpoint
