fn main() {
    println!("memwall");
}
