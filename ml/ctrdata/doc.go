// Package ctrdata holds click-through-rate data: samples of a 0/1 label,
// dense (numeric) fields and categorical fields (one key each), the
// shape of Criteo's display-advertising logs (13 dense and 26
// categorical fields).
//
// Two sources exist. A synthetic set (Generate; `pstrain data
// synth-ctr`) is drawn from a planted model, so the best AUC any model
// can reach on its test set is known (Meta.PlantedAUC). It is stored in
// a compact binary format of fixed-size records (format.go) that a
// trainer streams: nothing the size of the data set or of its
// vocabularies is held in memory. A Criteo text file (criteo.go) is read
// line by line, the dense counts log-transformed as usual.
//
// Both are read through Source: its samples are numbered, and Open
// streams a contiguous range of them into Batches, so a worker reads its
// own shard and a trainer reads epoch after epoch without loading the
// set. docs/models.md describes the generator and the format.
package ctrdata
