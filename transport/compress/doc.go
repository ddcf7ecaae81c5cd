// Package compress encodes a float32 vector (one shard's gradient, or
// the change to its parameters) into fewer bytes, and decodes it back.
//
// A Codec is a stateless encoding: top-k (the largest coordinates by
// magnitude, as indices and values), int8 (a power-of-two scale per
// chunk of values and one signed byte per value) or sign (one bit per
// value and, per chunk, a power-of-two scale near its mean magnitude). A Feedback wraps
// a codec with its error-feedback residual: Encode adds the residual to
// the vector, sends what the codec can carry and keeps the rest, which a
// later Encode sends. Nothing is dropped, only delayed:
//
//	fb := compress.NewFeedback(codec, n)
//	payload, err := fb.Encode(buf, segments) // sender, every step
//	err = codec.Decode(dst, payload)         // receiver: dst holds what was sent
//
// After any number of steps, the sum of what was decoded plus the
// residual is the sum of the vectors encoded (exactly when the float32
// additions are exact; Feedback's doc says what rounds).
//
// For the other direction, a Mirror (the sender's copy of what a
// receiver holds) and a Replica (the receiver's) send a vector that
// changes as compressed deltas from what the receiver holds (mirror.go).
//
// The encoded length of an n-value vector depends only on the codec and
// n (EncodedLen), so a receiver that knows n refuses any other length
// before decoding, and a sender's buffers are of a fixed size.
package compress
