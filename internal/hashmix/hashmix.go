// Package hashmix holds the splitmix64 finaliser, the one mixing function
// the embedding tables and the synthetic CTR data both draw from.
package hashmix

// Golden is the splitmix64 increment (2^64 divided by the golden ratio).
const Golden = 0x9e3779b97f4a7c15

// Mix is the splitmix64 finaliser: a bijection of 64-bit words whose
// outputs look independent for consecutive inputs.
func Mix(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}
