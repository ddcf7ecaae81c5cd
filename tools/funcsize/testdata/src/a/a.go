package a

// Each counts every construct gocyclo counts once: 1 + if + for + range +
// 2 cases (the default is free) + 1 comm clause (the default is free) +
// && + || + the if inside the closure = 10.
func Each(xs []int, ch chan int) int {
	n := 0
	if len(xs) > 0 && xs[0] > 0 || n < 0 {
		n++
	}
	for i := 0; i < 3; i++ {
		n += i
	}
	for _, x := range xs {
		switch x {
		case 1:
			n++
		case 2, 3:
			n--
		default:
		}
	}
	select {
	case v := <-ch:
		n += v
	default:
	}
	f := func() {
		if n > 1 {
			n = 1
		}
	}
	f()
	return n
}

// Plain has complexity 1 and is 3 lines long.
func Plain() int {
	return 1
}

type T[K comparable] struct{}

// M is a method on a generic type with a pointer receiver.
func (t *T[K]) M() {}

type U struct{}

// V is a method with a value receiver.
func (U) V() {}
