package dataset

// NamedShape is the sample size (Dim) and number of classes of a named data
// set, known without reading it: MNIST, its four-fold copy and
// Fashion-MNIST are 28x28 images of 10 classes. ok is false for an idx:
// data set, whose shape only its files tell (and for unknown names).
// A parameter server, which never loads the data, bounds its messages
// with it.
func NamedShape(name string) (dim, classes int, ok bool) {
	switch name {
	case "mnist", mnistX4Name, fashionName:
		return fashionSide * fashionSide, fashionClasses, true
	}
	return 0, 0, false
}
