first
secondthird
fourth